//! The functions of a build as front ends list them: `hcsflow functions`
//! (text and `--json`) and the Python package's `hcsflow.functions`.

use hcsflow_core::{ArgSpec, Artifacts, Contract, MemoryType};
use serde::Serialize;

use crate::Engine;

/// One function: what it does, its contract, the memory types it has
/// implementations for, its arguments (every one, `slice_by_slice`
/// included for flexible functions) and its artifacts. Serialised, it is
/// the `hcsflow functions --json` format.
#[derive(Debug, Clone, Serialize)]
pub struct FunctionListing {
    pub name: &'static str,
    pub doc: &'static str,
    pub contract: Contract,
    pub memory_types: Vec<MemoryType>,
    pub args: Vec<ArgSpec>,
    pub artifacts: Artifacts,
}

impl Engine {
    /// Every function this engine has, by name.
    ///
    /// ```
    /// let catalogue = hcsflow::Engine::builtin().catalogue();
    /// let max = catalogue.iter().find(|f| f.name == "max_projection").expect("a built-in");
    /// assert!(max.args.is_empty());
    /// ```
    pub fn catalogue(&self) -> Vec<FunctionListing> {
        self.registry()
            .functions()
            .map(|f| FunctionListing {
                name: f.spec.name,
                doc: f.spec.doc,
                contract: f.spec.contract,
                memory_types: f.memory_types(),
                args: f.all_args(),
                artifacts: f.artifacts.clone(),
            })
            .collect()
    }
}
