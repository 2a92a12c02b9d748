//! Progress of a run on stderr.
//!
//! On a terminal: an indicatif bar of the plate's wells (done of total, ETA)
//! and one line per well in flight with the step it is running, i.e. one per
//! busy worker. Otherwise (CI logs, pipes, files): plain lines, one per
//! finished or skipped well, which stay readable in a log. Failures and
//! skipped wells are printed as lines in both modes, above the bars.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hcsflow::pipeline::Progress;
use indicatif::{MultiProgress, ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Bars of a run on a terminal.
struct Bars {
    multi: MultiProgress,
    wells: ProgressBar,
    /// Well → its line, while the well runs.
    active: Mutex<HashMap<String, ProgressBar>>,
}

/// Turns [`Progress`] events into bars or plain lines.
pub struct Reporter {
    bars: Option<Bars>,
}

impl Reporter {
    /// Bars when `tty`, plain lines otherwise. `total` is the number of wells.
    pub fn new(total: usize, tty: bool) -> Reporter {
        if tty {
            Reporter::with_target(total, ProgressDrawTarget::stderr())
        } else {
            Reporter { bars: None }
        }
    }

    /// Bars drawn to `target` (tests draw to a hidden target and inspect the bars).
    fn with_target(total: usize, target: ProgressDrawTarget) -> Reporter {
        let multi = MultiProgress::with_draw_target(target);
        let wells = multi.add(ProgressBar::new(total as u64));
        // The templates are constants: a bad one is a bug caught by the tests, not a user error.
        if let Ok(style) = ProgressStyle::with_template("{prefix:>6} [{bar:32.cyan/blue}] {pos}/{len} wells  {elapsed_precise}  eta {eta}")
        {
            wells.set_style(style.progress_chars("=> "));
        }
        wells.set_prefix("plate");
        Reporter { bars: Some(Bars { multi, wells, active: Mutex::new(HashMap::new()) }) }
    }

    /// Prints a line above the bars (or plainly). A write error (the terminal
    /// or the log reader went away) is ignored: the run goes on (see `console`).
    fn line(&self, text: String) {
        match &self.bars {
            // Not `suspend`: it panics when the terminal cannot be written.
            Some(b) => {
                let _ = b.multi.println(text);
            }
            None => errln!("{text}"),
        }
    }

    pub fn event(&self, p: Progress<'_>) {
        match p {
            Progress::Skipped { well } => {
                self.line(format!("{well}: complete in a previous run, skipped (--resume)"));
                if let Some(b) = &self.bars {
                    b.wells.inc(1);
                }
            }
            Progress::Started { well } => {
                if let Some(b) = &self.bars {
                    let bar = b.multi.add(ProgressBar::new_spinner());
                    if let Ok(style) = ProgressStyle::with_template("  {spinner} {prefix}: {msg}") {
                        bar.set_style(style);
                    }
                    bar.set_prefix(well.to_string());
                    bar.set_message("reading");
                    bar.enable_steady_tick(Duration::from_millis(120));
                    if let Ok(mut a) = b.active.lock() {
                        a.insert(well.to_string(), bar);
                    }
                }
            }
            Progress::StepStarted { well, step, index, steps } => {
                if let Some(bar) = self.bars.as_ref().and_then(|b| b.active.lock().ok()?.get(well).cloned()) {
                    bar.set_message(format!("step {}/{steps} '{step}'", index + 1));
                }
            }
            Progress::Finished { well, done, total, seconds, error } => {
                if let Some(b) = &self.bars {
                    if let Some(bar) = b.active.lock().ok().and_then(|mut a| a.remove(well)) {
                        bar.finish_and_clear();
                        b.multi.remove(&bar);
                    }
                    b.wells.set_position(done as u64);
                }
                match error {
                    Some(e) => self.line(format!("[{done}/{total}] {well}: FAILED: {e}")),
                    // On a terminal the bar shows it; logs get one line per well.
                    None if self.bars.is_none() => self.line(format!("[{done}/{total}] {well}: done in {seconds:.2} s")),
                    None => {}
                }
            }
            // Before any well: a line of its own in both modes, and on a
            // terminal a spinner while it runs (a plate-wide fit takes seconds).
            Progress::PlateStepStarted { step, groups, planes } => {
                let what = format!("plate-wide step '{step}': {planes} planes in {groups} group{}", if groups == 1 { "" } else { "s" });
                match &self.bars {
                    Some(b) => {
                        let bar = b.multi.add(ProgressBar::new_spinner());
                        if let Ok(style) = ProgressStyle::with_template("  {spinner} {msg}") {
                            bar.set_style(style);
                        }
                        bar.set_message(what);
                        bar.enable_steady_tick(Duration::from_millis(120));
                        if let Ok(mut a) = b.active.lock() {
                            a.insert(plate_step_line(step), bar);
                        }
                    }
                    None => self.line(what),
                }
            }
            Progress::PlateStepFinished { step, seconds, reused, error } => {
                if let Some(b) = &self.bars {
                    if let Some(bar) = b.active.lock().ok().and_then(|mut a| a.remove(&plate_step_line(step))) {
                        bar.finish_and_clear();
                        b.multi.remove(&bar);
                    }
                }
                self.line(match (error, reused) {
                    (Some(e), _) => format!("plate-wide step '{step}': FAILED: {e}"),
                    (None, true) => format!("plate-wide step '{step}': complete in a previous run, its results re-read (--resume)"),
                    (None, false) => format!("plate-wide step '{step}': done in {seconds:.2} s"),
                });
            }
        }
    }

    /// Removes the bars before the summary is printed.
    pub fn finish(&self) {
        if let Some(b) = &self.bars {
            b.wells.finish_and_clear();
            let _ = b.multi.clear();
        }
    }
}

/// The key of a plate-wide step's line among the wells' lines (a step name
/// cannot be mistaken for a well name).
fn plate_step_line(step: &str) -> String {
    format!("plate-wide step {step}")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn active(r: &Reporter) -> Vec<(String, String)> {
        let b = r.bars.as_ref().unwrap();
        let mut v: Vec<(String, String)> = b.active.lock().unwrap().iter().map(|(w, bar)| (w.clone(), bar.message())).collect();
        v.sort();
        v
    }

    #[test]
    fn bars_follow_wells_and_their_current_step() {
        let r = Reporter::with_target(3, ProgressDrawTarget::hidden());
        let b = r.bars.as_ref().unwrap();
        assert_eq!(b.wells.length(), Some(3));
        r.event(Progress::Skipped { well: "A01" });
        assert_eq!(b.wells.position(), 1, "a skipped well counts as done");
        r.event(Progress::Started { well: "A02" });
        r.event(Progress::Started { well: "B01" });
        r.event(Progress::StepStarted { well: "A02", step: "max_z", index: 2, steps: 4 });
        r.event(Progress::StepStarted { well: "B01", step: "normalise", index: 0, steps: 4 });
        assert_eq!(active(&r), [("A02".into(), "step 3/4 'max_z'".into()), ("B01".into(), "step 1/4 'normalise'".into())]);
        r.event(Progress::Finished { well: "A02", done: 2, total: 3, seconds: 0.1, error: None });
        assert_eq!(active(&r), [("B01".into(), "step 1/4 'normalise'".into())], "a finished well's line goes");
        assert_eq!(b.wells.position(), 2);
        r.event(Progress::Finished { well: "B01", done: 3, total: 3, seconds: 0.1, error: Some("boom") });
        assert!(active(&r).is_empty());
        assert_eq!(b.wells.position(), 3, "a failed well is done too");
        r.finish();
        assert!(b.wells.is_finished());
    }

    /// A terminal that fails every write, like a tty after a hang-up (EIO).
    #[derive(Debug)]
    struct GoneTerminal;

    impl indicatif::TermLike for GoneTerminal {
        fn width(&self) -> u16 {
            80
        }
        fn move_cursor_up(&self, _: usize) -> std::io::Result<()> {
            Err(std::io::Error::other("gone"))
        }
        fn move_cursor_down(&self, _: usize) -> std::io::Result<()> {
            Err(std::io::Error::other("gone"))
        }
        fn move_cursor_right(&self, _: usize) -> std::io::Result<()> {
            Err(std::io::Error::other("gone"))
        }
        fn move_cursor_left(&self, _: usize) -> std::io::Result<()> {
            Err(std::io::Error::other("gone"))
        }
        fn write_line(&self, _: &str) -> std::io::Result<()> {
            Err(std::io::Error::other("gone"))
        }
        fn write_str(&self, _: &str) -> std::io::Result<()> {
            Err(std::io::Error::other("gone"))
        }
        fn clear_line(&self) -> std::io::Result<()> {
            Err(std::io::Error::other("gone"))
        }
        fn flush(&self) -> std::io::Result<()> {
            Err(std::io::Error::other("gone"))
        }
    }

    #[test]
    fn a_terminal_that_went_away_does_not_stop_the_events() {
        let r = Reporter::with_target(2, ProgressDrawTarget::term_like(Box::new(GoneTerminal)));
        r.event(Progress::Skipped { well: "A01" });
        r.event(Progress::Started { well: "A02" });
        r.event(Progress::Finished { well: "A02", done: 2, total: 2, seconds: 0.0, error: Some("boom") });
        r.finish();
        assert_eq!(r.bars.as_ref().unwrap().wells.position(), 2);
    }

    #[test]
    fn a_plate_wide_step_has_a_line_while_it_runs() {
        let r = Reporter::with_target(2, ProgressDrawTarget::hidden());
        r.event(Progress::PlateStepStarted { step: "flatfield", groups: 2, planes: 36 });
        assert_eq!(active(&r), [(plate_step_line("flatfield"), "plate-wide step 'flatfield': 36 planes in 2 groups".into())]);
        r.event(Progress::PlateStepFinished { step: "flatfield", seconds: 1.5, reused: false, error: None });
        assert!(active(&r).is_empty());
        assert_eq!(r.bars.as_ref().unwrap().wells.position(), 0, "a plate-wide step is not a well");
    }

    #[test]
    fn without_a_terminal_there_are_no_bars() {
        let r = Reporter::new(2, false);
        assert!(r.bars.is_none());
        // Events are printed as lines; none of them may panic without bars.
        r.event(Progress::Started { well: "A01" });
        r.event(Progress::StepStarted { well: "A01", step: "s", index: 0, steps: 1 });
        r.event(Progress::Finished { well: "A01", done: 1, total: 2, seconds: 0.0, error: None });
        r.finish();
    }
}
