//! Graceful stop of a run on SIGINT (Ctrl-C), SIGTERM (`kill`, SLURM at its
//! time limit, `scancel`) and SIGHUP (the terminal went away).
//!
//! Contract: the first of these signals sets the run's cancel flag (the
//! pipeline finishes the wells in flight, starts no more and writes its
//! manifest and summary), prints one line saying so, and is remembered
//! ([`received`]) so the run can end with "interrupted (SIGTERM): …" and exit
//! 130. A second signal ends the process at once with 128 + its number (130
//! for SIGINT, 143 for SIGTERM, 129 for SIGHUP); the atomic writes of the
//! pipeline still leave no partial file under a final name.
//!
//! A signal the process inherited as ignored stays ignored (`nohup` ignores
//! SIGHUP, shell scripts' background jobs SIGINT).
//!
//! On Unix the handler is a plain `sigaction` handler that only touches
//! atomics and calls `write(2)`/`_exit(2)` (async-signal-safe), which is how it
//! knows which signal arrived. Elsewhere the `ctrlc` crate (with its
//! `termination` feature) stands in, without the signal's name.

use std::sync::atomic::AtomicBool;
use std::sync::Arc;

#[cfg(unix)]
mod imp {
    use std::sync::atomic::{AtomicBool, AtomicI32, AtomicPtr, Ordering};
    use std::sync::Arc;

    /// The first signal received (0: none).
    static RECEIVED: AtomicI32 = AtomicI32::new(0);
    /// The cancel flag of the run (leaked from an `Arc`, so it lives for good).
    static CANCEL: AtomicPtr<AtomicBool> = AtomicPtr::new(std::ptr::null_mut());

    const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

    fn message(sig: libc::c_int) -> &'static [u8] {
        match sig {
            libc::SIGINT => b"interrupted (SIGINT): finishing the wells in flight, starting no more (Ctrl-C again to stop at once)\n",
            libc::SIGTERM => b"interrupted (SIGTERM): finishing the wells in flight, starting no more (send it again to stop at once)\n",
            _ => b"interrupted (SIGHUP): finishing the wells in flight, starting no more (send it again to stop at once)\n",
        }
    }

    pub fn name(sig: i32) -> &'static str {
        match sig {
            libc::SIGINT => "SIGINT",
            libc::SIGTERM => "SIGTERM",
            libc::SIGHUP => "SIGHUP",
            _ => "signal",
        }
    }

    extern "C" fn on_signal(sig: libc::c_int) {
        if RECEIVED.compare_exchange(0, sig, Ordering::SeqCst, Ordering::SeqCst).is_err() {
            // SAFETY: _exit is async-signal-safe.
            unsafe { libc::_exit(128 + sig) };
        }
        let cancel = CANCEL.load(Ordering::SeqCst);
        if !cancel.is_null() {
            // SAFETY: CANCEL only ever holds a pointer leaked from an Arc (never freed).
            unsafe { (*cancel).store(true, Ordering::SeqCst) };
        }
        let text = message(sig);
        // SAFETY: write is async-signal-safe; its result is ignored like every stderr write.
        let _ = unsafe { libc::write(libc::STDERR_FILENO, text.as_ptr().cast(), text.len()) };
    }

    pub fn install(cancel: Arc<AtomicBool>) -> std::io::Result<()> {
        // A previous flag (a second run in one process) is leaked: one bool.
        CANCEL.store(Arc::into_raw(cancel).cast_mut(), Ordering::SeqCst);
        for sig in SIGNALS {
            // SAFETY: a zeroed sigaction is valid; the handler only uses async-signal-safe calls.
            let ok = unsafe {
                let mut old: libc::sigaction = std::mem::zeroed();
                if libc::sigaction(sig, std::ptr::null(), &mut old) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                // A signal the parent ignores stays ignored (`nohup` ignores SIGHUP;
                // a shell script's background jobs ignore SIGINT).
                if old.sa_sigaction == libc::SIG_IGN {
                    continue;
                }
                let mut action: libc::sigaction = std::mem::zeroed();
                action.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as libc::sighandler_t;
                action.sa_flags = libc::SA_RESTART;
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(sig, &action, std::ptr::null_mut()) == 0
            };
            if !ok {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    pub fn received() -> Option<&'static str> {
        match RECEIVED.load(Ordering::SeqCst) {
            0 => None,
            sig => Some(name(sig)),
        }
    }
}

#[cfg(not(unix))]
mod imp {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    static RECEIVED: AtomicBool = AtomicBool::new(false);

    pub fn install(cancel: Arc<AtomicBool>) -> std::io::Result<()> {
        ctrlc::set_handler(move || {
            if RECEIVED.swap(true, Ordering::SeqCst) {
                std::process::exit(130);
            }
            cancel.store(true, Ordering::SeqCst);
            errln!("interrupted: finishing the wells in flight, starting no more (Ctrl-C again to stop at once)");
        })
        .map_err(std::io::Error::other)
    }

    pub fn received() -> Option<&'static str> {
        RECEIVED.load(Ordering::SeqCst).then_some("Ctrl-C")
    }
}

/// Installs the handlers for a run whose cancel flag is `cancel` (see the
/// module doc). Called once per run, before its first well starts.
pub fn install(cancel: &Arc<AtomicBool>) -> std::io::Result<()> {
    imp::install(cancel.clone())
}

/// The signal that asked the run to stop ("SIGTERM", …), if one arrived.
pub fn received() -> Option<&'static str> {
    imp::received()
}
