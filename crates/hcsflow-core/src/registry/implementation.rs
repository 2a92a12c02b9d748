//! Implementations: the code that runs a function on one memory type. A
//! function declared in Rust makes them typed by its argument struct through
//! its [`FunctionDecl`](crate::FunctionDecl) (`host`, `host_owned`, `device`).

use std::fmt;
use std::sync::Arc;

use super::args::{Args, StackShape};
use super::FunctionError;
use crate::artifact::CallContext;
use crate::dtype::DType;
use crate::memory::{Array, MemoryType};
use crate::stack::Stack;

/// A host kernel on a borrowed stack, with the call's [`CallContext`]
/// (injected metadata, consumed artifacts; it records what it produces there).
pub type HostKernel = Arc<dyn Fn(&Stack, &Args, &mut CallContext) -> Result<Stack, FunctionError> + Send + Sync>;
/// A kernel on any memory type: receives an array of the implementation's
/// input memory type, returns one of its output memory type.
pub type ArrayKernel = Arc<dyn Fn(Array, &Args, &mut CallContext) -> Result<Array, FunctionError> + Send + Sync>;

/// One implementation of a logical function. Every kernel receives the
/// call's [`CallContext`]; one that needs no metadata or artifacts ignores it.
#[derive(Clone)]
pub struct Implementation {
    pub memory_in: MemoryType,
    pub memory_out: MemoryType,
    pub(super) kernel: ArrayKernel,
    /// For host kernels of per-plane contracts: the registry splits planes.
    pub(super) per_plane_host: Option<HostKernel>,
    /// Work this implementation does on the host, with its input brought
    /// there, when a call has no `without` artifact (see [`HostWork`]).
    pub host_work: Option<HostWork>,
    /// Device memory it allocates besides its input and output (see
    /// [`ScratchRule`]); `None`: none.
    pub scratch: Option<ScratchRule>,
}

/// The bytes of device memory an implementation allocates for a stack of
/// `shape` and `dtype`, besides its input and output buffers (temporary
/// planes, histograms, look-up tables): declared by the GPU crate with its
/// kernels ([`Binding::with_scratch`](crate::Binding::with_scratch)), read by
/// [`CallPlan::working_set`](crate::CallPlan::working_set).
pub type ScratchRule = fn(&StackShape, DType) -> u64;

/// What a device implementation does on the host when an optional artifact
/// it consumes is absent: e.g. the wgpu `assemble` downloads the tiles and
/// registers them on the host when no earlier step produced `positions`. The
/// pipeline compiler plans that download as a route and the plan shows it,
/// so no copy to the host is hidden.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HostWork {
    /// The artifact whose absence makes the implementation work on the host.
    pub without: &'static str,
    /// What it does there, for the plan ("registers the tiles").
    pub work: &'static str,
}

impl fmt::Debug for Implementation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Implementation({} → {})", self.memory_in, self.memory_out)
    }
}

impl Implementation {
    /// A host implementation on a borrowed stack. For [`Contract::Pure2d`](crate::Contract::Pure2d) (and
    /// flexible functions called with `slice_by_slice`) the registry calls it
    /// once per plane with a one-plane stack, in parallel, with a context
    /// holding that plane's metadata and artifact rows; what the planes
    /// produce is merged in plane order.
    pub fn host(kernel: impl Fn(&Stack, &Args, &mut CallContext) -> Result<Stack, FunctionError> + Send + Sync + 'static) -> Self {
        let kernel: HostKernel = Arc::new(kernel);
        let whole = kernel.clone();
        Implementation {
            memory_in: MemoryType::Host,
            memory_out: MemoryType::Host,
            kernel: Arc::new(move |array, args, context| Ok(Array::from(whole(&host_input(array)?, args, context)?))),
            per_plane_host: Some(kernel),
            host_work: None,
            scratch: None,
        }
    }

    /// A host implementation that receives the whole stack *by value*, whatever
    /// the contract: for functions that treat every plane on their own already
    /// (the registry then makes no per-plane copies) and for functions whose
    /// result has the input's dtype and shape, which may overwrite the input
    /// instead of allocating a second stack. The registry still checks the
    /// contract's plane count.
    pub fn host_owned(kernel: impl Fn(Stack, &Args, &mut CallContext) -> Result<Stack, FunctionError> + Send + Sync + 'static) -> Self {
        Implementation::array(MemoryType::Host, MemoryType::Host, move |array, args, context| {
            Ok(Array::from(kernel(host_input(array)?, args, context)?))
        })
    }

    /// An implementation on arrays of `memory_in` returning `memory_out`
    /// (GPU runtimes). It receives the whole stack whatever the contract.
    pub fn array(
        memory_in: MemoryType,
        memory_out: MemoryType,
        kernel: impl Fn(Array, &Args, &mut CallContext) -> Result<Array, FunctionError> + Send + Sync + 'static,
    ) -> Self {
        Implementation { memory_in, memory_out, kernel: Arc::new(kernel), per_plane_host: None, host_work: None, scratch: None }
    }
}

/// The host stack a host kernel receives; a clear error for anything else.
fn host_input(array: Array) -> Result<Stack, FunctionError> {
    let got = array.memory_type();
    let shape = array.shape().to_vec();
    array.into_host_stack().ok_or_else(|| {
        if got == MemoryType::Host {
            FunctionError::NotAStack { function: String::new(), shape }
        } else {
            FunctionError::WrongMemory { function: String::new(), expected: MemoryType::Host, got }
        }
    })
}
