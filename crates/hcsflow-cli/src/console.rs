//! Everything the CLI prints goes through here, so a closed pipe never panics.
//!
//! - stdout carries a command's result (a listing, JSON, a plan). When its
//!   reader goes away (`hcsflow inspect --json | head`), [`stdout`] returns
//!   [`StdoutClosed`] and the command stops there; `main` ends it with exit 0
//!   and no message, as ripgrep does. Any other stdout error (a full disk
//!   behind a redirection) is a failure (exit 1).
//! - stderr carries progress lines, the summary and logs. A write error there
//!   (`2>&1 | head`, a log shipper that disconnected) is ignored: a run that
//!   lost its log reader still finishes every well and writes its summary and
//!   manifest.
//!
//! Use the macros `out!`/`outln!` (stdout, `?` after them) and
//! `err!`/`errln!` (stderr) instead of `print!`/`println!`/`eprint!`/
//! `eprintln!`, which panic when the write fails.

use std::fmt;
use std::io::{self, Write};

use crate::{CliError, Exit};

/// Writes to stdout; `?` after it. See the module doc.
macro_rules! out {
    ($($arg:tt)*) => {
        $crate::console::stdout(format_args!($($arg)*))
    };
}

/// Writes a line to stdout; `?` after it. See the module doc.
macro_rules! outln {
    () => {
        $crate::console::stdout(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::console::stdout(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// Writes to stderr, ignoring write errors. See the module doc.
macro_rules! err {
    ($($arg:tt)*) => {
        $crate::console::stderr(format_args!($($arg)*))
    };
}

/// Writes a line to stderr, ignoring write errors. See the module doc.
macro_rules! errln {
    () => {
        $crate::console::stderr(format_args!("\n"))
    };
    ($($arg:tt)*) => {
        $crate::console::stderr(format_args!("{}\n", format_args!($($arg)*)))
    };
}

/// The reader of stdout went away (broken pipe): the command stops, exit 0.
#[derive(Debug)]
pub struct StdoutClosed;

impl fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("stdout was closed by its reader")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `args` to stdout and flushes. `Err(StdoutClosed)` (exit 0, quiet)
/// on a broken pipe; any other write error is a failure naming stdout.
pub fn stdout(args: fmt::Arguments<'_>) -> Result<(), CliError> {
    let mut out = io::stdout().lock();
    match out.write_fmt(args).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Err(CliError::new(Exit::Failure, StdoutClosed)),
        Err(e) => Err(CliError::new(Exit::Failure, anyhow::anyhow!("writing to stdout: {e}"))),
    }
}

/// Writes `args` to stderr; a write error is ignored (see the module doc).
pub fn stderr(args: fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(args);
}

/// A stderr writer that reports every write as done, for the log subscriber
/// (whatever happens to stderr, logging never fails or panics).
#[derive(Debug, Clone, Copy, Default)]
pub struct Stderr;

impl Write for Stderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let _ = io::stderr().write_all(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}
