//! The engine's log events in Python's `logging`: every `tracing` event at
//! INFO or above (a run's notes and warnings: outputs removed by
//! `overwrite`, temporary files of an interrupted run cleaned up, a file
//! system without locks) goes to the logger `hcsflow`, at the matching level,
//! with the Rust module as `extra={"target": ...}`. Events below INFO are
//! filtered out before any Python call, so the engine's hot paths never take
//! the GIL for logging.

use std::fmt::Write;

use pyo3::prelude::*;
use pyo3::types::PyDict;
use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::layer::{Context, Layer, SubscriberExt};

/// Forwards events to the Python logger `hcsflow`.
struct PythonLogging;

/// Python's level number for a `tracing` level.
fn python_level(level: &Level) -> u32 {
    match *level {
        Level::ERROR => 40,
        Level::WARN => 30,
        Level::INFO => 20,
        Level::DEBUG => 10,
        Level::TRACE => 5,
    }
}

/// The event's message, then its other fields as `name=value`.
#[derive(Default)]
struct Message(String);

impl Visit for Message {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "message" {
            let _ = write!(self.0, "{value:?}");
        } else {
            let _ = write!(self.0, " {}={value:?}", field.name());
        }
    }
}

impl<S: Subscriber> Layer<S> for PythonLogging {
    fn on_event(&self, event: &Event<'_>, _context: Context<'_, S>) {
        let metadata = event.metadata();
        let mut message = Message::default();
        event.record(&mut message);
        let level = python_level(metadata.level());
        Python::attach(|py| {
            let logged = (|| -> PyResult<()> {
                let logger = py.import("logging")?.call_method1("getLogger", ("hcsflow",))?;
                if logger.call_method1("isEnabledFor", (level,))?.extract()? {
                    let extra = PyDict::new(py);
                    extra.set_item("target", metadata.target())?;
                    let kwargs = PyDict::new(py);
                    kwargs.set_item("extra", extra)?;
                    logger.call_method("log", (level, message.0.as_str()), Some(&kwargs))?;
                }
                Ok(())
            })();
            // A logging handler that raises must not fail the run: Python reports it as unraisable.
            if let Err(e) = logged {
                e.write_unraisable(py, None);
            }
        });
    }
}

/// Installs the bridge as this process's `tracing` subscriber, unless the
/// process has one already (an embedding program's own).
pub fn install() {
    let subscriber = tracing_subscriber::registry().with(PythonLogging.with_filter(LevelFilter::INFO));
    let _ = tracing::subscriber::set_global_default(subscriber);
}
