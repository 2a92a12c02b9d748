//! Python programs as independent references ("oracles") for tests.
//!
//! The one policy for a missing oracle (python3 not on `PATH`, or a package
//! it lacks):
//! - under `CI=true` (or `CI=1`) the test **fails**, naming the missing
//!   packages and the pip command: CI never skips an oracle;
//! - elsewhere it fails the same way, unless `HCSFLOW_SKIP_ORACLES=1`: then
//!   it prints a `SKIPPED:` line to stderr and the test returns early.
//!
//! ```no_run
//! let Some(python) = hcsflow_testkit::oracle::require(&["numpy"], "pip install numpy") else {
//!     return; // skipped, and said so
//! };
//! let out = python.run(["-c", "import numpy; print(numpy.arange(3).sum())"]);
//! assert_eq!(out.trim(), "3");
//! ```

use std::ffi::OsStr;
use std::fmt;
use std::io::Write;
use std::process::{Command, Output};

/// The Python interpreter the oracles run on: `python3` on `PATH`
/// (`scripts/test` puts the oracle virtualenv first there).
const PYTHON: &str = "python3";

/// Python that imports each module named on its command line and prints the
/// ones it cannot import (one per line, `name: error`); then, if all import,
/// evaluates the condition in `HCSFLOW_ORACLE_CONDITION` (if any) and prints
/// it when false. Exit status 0 exactly when nothing was printed.
const PROBE: &str = r#"
import importlib, os, sys
missing = []
for m in sys.argv[1:]:
    try:
        importlib.import_module(m)
    except Exception as e:
        missing.append(f"{m}: {type(e).__name__}: {e}")
cond = os.environ.get("HCSFLOW_ORACLE_CONDITION", "")
if not missing and cond:
    env = {m.split(".")[0]: importlib.import_module(m.split(".")[0]) for m in sys.argv[1:]}
    try:
        ok = eval(cond, env)
    except Exception as e:
        ok, cond = False, f"{cond} ({type(e).__name__}: {e})"
    if not ok:
        missing.append(f"condition not met: {cond}")
print("\n".join(missing))
sys.exit(1 if missing else 0)
"#;

/// What the environment says about skipping a missing oracle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Running in CI (`CI` is `true` or `1`): a missing oracle always fails.
    pub ci: bool,
    /// `HCSFLOW_SKIP_ORACLES=1`: skip a missing oracle (outside CI only).
    pub skip_requested: bool,
}

impl Policy {
    /// The policy of this process's environment.
    pub fn from_env() -> Policy {
        Policy { ci: crate::in_ci(), skip_requested: std::env::var("HCSFLOW_SKIP_ORACLES").as_deref() == Ok("1") }
    }

    /// Whether a missing oracle may be skipped: asked for, and not in CI.
    pub fn may_skip(self) -> bool {
        self.skip_requested && !self.ci
    }
}

/// A missing oracle that may not be skipped: what is missing and how to
/// install it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Missing {
    /// The Python modules asked for.
    pub modules: Vec<String>,
    /// What the probe found missing: `module: error` lines, or why python3
    /// could not start.
    pub problems: String,
    /// The install command to suggest.
    pub pip: String,
    /// Whether the policy was CI's (no skipping possible).
    pub ci: bool,
}

impl fmt::Display for Missing {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "the Python oracle needs {PYTHON} with {}; missing: {}. Run `{}`",
            self.modules.join(", "),
            self.problems.trim(),
            self.pip
        )?;
        if self.ci {
            write!(f, " (CI=true: oracle tests never skip in CI)")
        } else {
            write!(f, " (or set HCSFLOW_SKIP_ORACLES=1 to skip oracle tests outside CI)")
        }
    }
}

/// A Python interpreter that has every module a test asked for.
#[derive(Debug, Clone)]
pub struct Oracle {
    python: String,
}

/// The oracle with `modules` importable, under this environment's
/// [`Policy`]: `Some` when available; `None` (after a visible `SKIPPED:` line
/// naming the test) when missing and skipping is allowed.
///
/// # Panics
/// When the oracle is missing and may not be skipped (always in CI), with a
/// message naming the missing modules and `pip`, the install command.
#[track_caller]
pub fn require(modules: &[&str], pip: &str) -> Option<Oracle> {
    require_where(modules, "", pip)
}

/// [`require`], with a Python expression over the imported modules that must
/// also hold (e.g. `int(zarr.__version__.split('.')[0]) >= 3`); `""` for none.
#[track_caller]
pub fn require_where(modules: &[&str], condition: &str, pip: &str) -> Option<Oracle> {
    match require_under(Policy::from_env(), PYTHON, modules, condition, pip) {
        Ok(oracle) => oracle,
        Err(missing) => panic!("{}: {missing}", test_name()),
    }
}

/// The decision of [`require_where`] under an explicit `policy` and
/// interpreter: `Err` when the oracle is missing and may not be skipped.
pub fn require_under(policy: Policy, python: &str, modules: &[&str], condition: &str, pip: &str) -> Result<Option<Oracle>, Missing> {
    let probe = Command::new(python).arg("-c").arg(PROBE).args(modules).env("HCSFLOW_ORACLE_CONDITION", condition).output();
    let problems = match probe {
        Ok(out) if out.status.success() => return Ok(Some(Oracle { python: python.to_string() })),
        Ok(out) => {
            let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
            if said.is_empty() {
                format!("the probe failed: {}", String::from_utf8_lossy(&out.stderr).trim())
            } else {
                said.lines().collect::<Vec<_>>().join("; ")
            }
        }
        Err(e) => format!("{python} could not be started: {e}"),
    };
    if policy.may_skip() {
        let _ = writeln!(std::io::stderr(), "SKIPPED: {} (oracle missing: {problems}; HCSFLOW_SKIP_ORACLES=1)", test_name());
        return Ok(None);
    }
    Err(Missing { modules: modules.iter().map(|m| m.to_string()).collect(), problems, pip: pip.to_string(), ci: policy.ci })
}

/// The running test's name (libtest names each test's thread after it).
fn test_name() -> String {
    std::thread::current().name().unwrap_or("oracle test").to_string()
}

impl Oracle {
    /// A command running the interpreter, for callers that need more than
    /// [`Oracle::run`] (stdin, environment, their own status handling).
    pub fn command(&self) -> Command {
        Command::new(&self.python)
    }

    /// Runs the interpreter with `args` (a script path, or `-c CODE`, then its
    /// arguments) and returns its stdout; its stderr, if any, is printed
    /// (shown with `--nocapture`).
    ///
    /// # Panics
    /// If it cannot start, exits non-zero (with both streams in the message),
    /// or prints stdout that is not UTF-8.
    pub fn run<I, S>(&self, args: I) -> String
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let args: Vec<S> = args.into_iter().collect();
        let shown = || args.iter().map(|a| a.as_ref().to_string_lossy().into_owned()).collect::<Vec<_>>().join(" ");
        let out: Output = self.command().args(&args).output().unwrap_or_else(|e| panic!("{} could not be started: {e}", self.python));
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "oracle `{} {}` failed ({}):\n{stdout}\n{stderr}", self.python, shown(), out.status);
        if !stderr.trim().is_empty() {
            println!("oracle stderr:\n{stderr}");
        }
        String::from_utf8(out.stdout).unwrap_or_else(|e| panic!("oracle `{}` printed non-UTF-8 output: {e}", shown()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: &str = "hcsflow_testkit_no_such_module";
    const PIP: &str = "pip install hcsflow-no-such-package";

    #[test]
    fn in_ci_a_missing_module_fails_naming_it_and_the_pip_command() {
        for skip_requested in [false, true] {
            let policy = Policy { ci: true, skip_requested };
            let missing = require_under(policy, PYTHON, &["sys", NONE], "", PIP).unwrap_err();
            let text = missing.to_string();
            assert!(text.contains(NONE) && text.contains(PIP) && text.contains("CI=true"), "{text}");
            assert!(!missing.problems.contains("sys:"), "only the missing module is named: {text}");
        }
    }

    #[test]
    fn outside_ci_a_missing_module_fails_unless_skipping_was_asked_for() {
        let missing = require_under(Policy { ci: false, skip_requested: false }, PYTHON, &[NONE], "", PIP).unwrap_err();
        assert!(missing.to_string().contains("HCSFLOW_SKIP_ORACLES=1"), "{missing}");
        let skipped = require_under(Policy { ci: false, skip_requested: true }, PYTHON, &[NONE], "", PIP).unwrap();
        assert!(skipped.is_none());
    }

    #[test]
    fn a_missing_interpreter_is_a_missing_oracle() {
        let policy = Policy { ci: true, skip_requested: true };
        let missing = require_under(policy, "hcsflow-no-such-python3", &["sys"], "", PIP).unwrap_err();
        assert!(missing.problems.contains("could not be started"), "{missing}");
        assert!(require_under(Policy { ci: false, skip_requested: true }, "hcsflow-no-such-python3", &["sys"], "", PIP).unwrap().is_none());
    }

    /// Needs python3 itself (under the usual policy): the standard library is always there.
    #[test]
    fn a_present_module_and_a_true_condition_give_an_oracle_under_every_policy() {
        if require(&["sys"], "install python3").is_none() {
            return;
        }
        for ci in [false, true] {
            for skip_requested in [false, true] {
                let oracle = require_under(Policy { ci, skip_requested }, PYTHON, &["sys", "json"], "sys.maxsize > 0", PIP);
                let oracle = oracle.unwrap().expect("available");
                assert_eq!(oracle.run(["-c", "import sys; print(sys.argv[1])", "hello"]).trim(), "hello");
            }
        }
        let false_condition = require_under(Policy { ci: true, skip_requested: false }, PYTHON, &["sys"], "sys.maxsize < 0", PIP);
        assert!(false_condition.unwrap_err().problems.contains("condition not met: sys.maxsize < 0"));
    }

    #[test]
    #[should_panic(expected = "exit status")]
    fn a_failing_script_fails_the_test() {
        let oracle = Oracle { python: PYTHON.into() };
        oracle.run(["-c", "import sys; sys.exit(3)"]);
    }
}
