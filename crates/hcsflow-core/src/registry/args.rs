//! Arguments: their declarations ([`ArgSpec`]), values, validation and
//! errors, the typed struct a function reads them through ([`FunctionArgs`],
//! [`function_args!`](crate::function_args)), and the checks a function declares on them.

use std::collections::BTreeMap;
use std::fmt;
use std::marker::PhantomData;
use std::sync::Arc;

use serde::Serialize;

/// The type of an argument, with its valid range.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ArgKind {
    Int {
        #[serde(skip_serializing_if = "Option::is_none")]
        min: Option<i64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        max: Option<i64>,
    },
    Float {
        #[serde(skip_serializing_if = "Option::is_none")]
        min: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        max: Option<f64>,
    },
    Bool,
    /// One of a fixed set of strings.
    Choice {
        choices: Vec<&'static str>,
    },
    /// Free text, e.g. a file path (empty allowed when it means "none").
    Text,
    /// A list of numbers, each in the range; on the command line comma-separated
    /// (`0.5,0.3,0.2`, optionally in brackets). The empty list is allowed when
    /// `min_len` is 0.
    FloatList {
        #[serde(skip_serializing_if = "Option::is_none")]
        min: Option<f64>,
        #[serde(skip_serializing_if = "Option::is_none")]
        max: Option<f64>,
        min_len: usize,
    },
}

impl ArgKind {
    fn type_name(&self) -> &'static str {
        match self {
            ArgKind::Int { .. } => "an integer",
            ArgKind::Float { .. } => "a number",
            ArgKind::Bool => "true or false",
            ArgKind::Choice { .. } => "one of the listed choices",
            ArgKind::Text => "text",
            ArgKind::FloatList { .. } => "a comma-separated list of numbers",
        }
    }
}

/// A value of an argument.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum ArgValue {
    Int(i64),
    Float(f64),
    Bool(bool),
    Str(String),
    FloatList(Vec<f64>),
}

impl fmt::Display for ArgValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ArgValue::Int(v) => write!(f, "{v}"),
            ArgValue::Float(v) => write!(f, "{v}"),
            ArgValue::Bool(v) => write!(f, "{v}"),
            ArgValue::Str(v) => write!(f, "'{v}'"),
            ArgValue::FloatList(v) => {
                let items: Vec<String> = v.iter().map(|x| x.to_string()).collect();
                write!(f, "[{}]", items.join(", "))
            }
        }
    }
}

/// One argument of a function: name, type and range, default, one-line doc.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ArgSpec {
    pub name: &'static str,
    #[serde(flatten)]
    pub kind: ArgKind,
    pub default: ArgValue,
    pub doc: &'static str,
}

impl ArgSpec {
    pub fn int(name: &'static str, default: i64, min: Option<i64>, max: Option<i64>, doc: &'static str) -> Self {
        ArgSpec { name, kind: ArgKind::Int { min, max }, default: ArgValue::Int(default), doc }
    }
    pub fn float(name: &'static str, default: f64, min: Option<f64>, max: Option<f64>, doc: &'static str) -> Self {
        ArgSpec { name, kind: ArgKind::Float { min, max }, default: ArgValue::Float(default), doc }
    }
    pub fn bool(name: &'static str, default: bool, doc: &'static str) -> Self {
        ArgSpec { name, kind: ArgKind::Bool, default: ArgValue::Bool(default), doc }
    }
    pub fn choice(name: &'static str, default: &'static str, choices: &[&'static str], doc: &'static str) -> Self {
        ArgSpec { name, kind: ArgKind::Choice { choices: choices.to_vec() }, default: ArgValue::Str(default.to_string()), doc }
    }
    pub fn text(name: &'static str, default: &'static str, doc: &'static str) -> Self {
        ArgSpec { name, kind: ArgKind::Text, default: ArgValue::Str(default.to_string()), doc }
    }

    pub fn float_list(
        name: &'static str,
        default: Vec<f64>,
        min: Option<f64>,
        max: Option<f64>,
        min_len: usize,
        doc: &'static str,
    ) -> Self {
        ArgSpec { name, kind: ArgKind::FloatList { min, max, min_len }, default: ArgValue::FloatList(default), doc }
    }

    /// Checks a value against type and range; coerces integers given for floats
    /// (and a single number given for a list).
    pub(crate) fn validate(&self, function: &str, value: ArgValue) -> Result<ArgValue, ArgError> {
        let wrong = |got: &ArgValue| ArgError::WrongType {
            function: function.to_string(),
            name: self.name.to_string(),
            expected: self.kind.type_name().to_string(),
            got: got.to_string(),
        };
        let out_of_range = |value: String, range: String| ArgError::OutOfRange {
            function: function.to_string(),
            name: self.name.to_string(),
            value,
            range,
        };
        match (&self.kind, value) {
            (ArgKind::Int { min, max }, ArgValue::Int(v)) => {
                if min.is_some_and(|m| v < m) || max.is_some_and(|m| v > m) {
                    return Err(out_of_range(v.to_string(), range_text(*min, *max)));
                }
                Ok(ArgValue::Int(v))
            }
            (ArgKind::Float { min, max }, v @ (ArgValue::Int(_) | ArgValue::Float(_))) => {
                let x = match v {
                    ArgValue::Int(i) => i as f64,
                    ArgValue::Float(f) => f,
                    _ => unreachable!(),
                };
                if !x.is_finite() {
                    return Err(wrong(&ArgValue::Float(x)));
                }
                if min.is_some_and(|m| x < m) || max.is_some_and(|m| x > m) {
                    return Err(out_of_range(x.to_string(), range_text(*min, *max)));
                }
                Ok(ArgValue::Float(x))
            }
            (ArgKind::FloatList { min, max, min_len }, v @ (ArgValue::FloatList(_) | ArgValue::Float(_) | ArgValue::Int(_))) => {
                let list = match v {
                    ArgValue::FloatList(l) => l,
                    ArgValue::Float(f) => vec![f],
                    ArgValue::Int(i) => vec![i as f64],
                    _ => unreachable!(),
                };
                if let Some(bad) = list.iter().find(|x| !x.is_finite()) {
                    return Err(wrong(&ArgValue::Float(*bad)));
                }
                if let Some(bad) = list.iter().find(|&&x| min.is_some_and(|m| x < m) || max.is_some_and(|m| x > m)) {
                    return Err(out_of_range(
                        format!("{} (element {bad})", ArgValue::FloatList(list.clone())),
                        format!("every element {}", range_text(*min, *max)),
                    ));
                }
                if list.len() < *min_len {
                    return Err(out_of_range(ArgValue::FloatList(list).to_string(), format!("a list of at least {min_len} numbers")));
                }
                Ok(ArgValue::FloatList(list))
            }
            (ArgKind::Bool, ArgValue::Bool(b)) => Ok(ArgValue::Bool(b)),
            (ArgKind::Choice { choices }, ArgValue::Str(s)) => {
                if choices.contains(&s.as_str()) {
                    Ok(ArgValue::Str(s))
                } else {
                    Err(out_of_range(format!("'{s}'"), format!("one of {}", choices.join(", "))))
                }
            }
            (ArgKind::Text, ArgValue::Str(s)) => Ok(ArgValue::Str(s)),
            (_, other) => Err(wrong(&other)),
        }
    }

    /// Parses a command-line string (`--arg name=text`) as this argument's type.
    pub fn parse_text(&self, function: &str, text: &str) -> Result<ArgValue, ArgError> {
        let value = match &self.kind {
            ArgKind::Int { .. } => text.trim().parse::<i64>().map(ArgValue::Int).ok(),
            ArgKind::Float { .. } => text.trim().parse::<f64>().map(ArgValue::Float).ok(),
            ArgKind::Bool => match text.trim() {
                "true" | "yes" | "1" => Some(ArgValue::Bool(true)),
                "false" | "no" | "0" => Some(ArgValue::Bool(false)),
                _ => None,
            },
            ArgKind::Choice { .. } | ArgKind::Text => Some(ArgValue::Str(text.to_string())),
            ArgKind::FloatList { .. } => {
                let t = text.trim();
                let t = t.strip_prefix('[').and_then(|t| t.strip_suffix(']')).unwrap_or(t).trim();
                if t.is_empty() {
                    Some(ArgValue::FloatList(Vec::new()))
                } else {
                    t.split(',').map(|x| x.trim().parse::<f64>().ok()).collect::<Option<Vec<f64>>>().map(ArgValue::FloatList)
                }
            }
        };
        let value = value.ok_or_else(|| ArgError::WrongType {
            function: function.to_string(),
            name: self.name.to_string(),
            expected: self.kind.type_name().to_string(),
            got: format!("'{text}'"),
        })?;
        self.validate(function, value)
    }
}

fn range_text<T: fmt::Display>(min: Option<T>, max: Option<T>) -> String {
    match (min, max) {
        (Some(a), Some(b)) => format!("[{a}, {b}]"),
        (Some(a), None) => format!(">= {a}"),
        (None, Some(b)) => format!("<= {b}"),
        (None, None) => "any value".into(),
    }
}

/// An argument problem, found before any pixel is read.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ArgError {
    #[error("{function}: unknown argument '{name}'{}; its arguments are: {}", suggestion.as_ref().map(|s| format!(" (did you mean '{s}'?)")).unwrap_or_default(), if known.is_empty() { "(none)".to_string() } else { known.join(", ") })]
    Unknown { function: String, name: String, known: Vec<String>, suggestion: Option<String> },
    #[error("{function}: argument '{name}' expects {expected}, got {got}")]
    WrongType { function: String, name: String, expected: String, got: String },
    #[error("{function}: argument '{name}' = {value} is out of range: must be {range}")]
    OutOfRange { function: String, name: String, value: String, range: String },
    #[error("malformed argument '{0}': expected name=value")]
    Malformed(String),
    /// A function's [`ArgCheck`] refused the arguments for the stack the call
    /// gets: `name` is the argument to blame, `None` when the stack itself is
    /// wrong whatever the arguments (see [`blamed`]).
    #[error("{function}: {}: {problem} (checked against a stack of {shape}); {fix}", blamed(.name.as_deref()))]
    Invalid { function: String, name: Option<String>, problem: String, fix: String, shape: StackShape },
}

/// What an [`ArgError::Invalid`] blames, for messages: `argument 'size'`, or
/// `the input stack` when no argument is to blame.
pub fn blamed(arg: Option<&str>) -> String {
    arg.map_or_else(|| "the input stack".to_string(), |a| format!("argument '{a}'"))
}

/// The shape of the stack one call receives: `depth` planes of `height` ×
/// `width` pixels. A per-plane call (a [`Contract::Pure2d`](crate::Contract::Pure2d) function, or a
/// flexible one with `slice_by_slice`) receives one plane at a time: depth 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub struct StackShape {
    pub depth: usize,
    pub height: usize,
    pub width: usize,
}

impl StackShape {
    pub fn new(depth: usize, height: usize, width: usize) -> Self {
        StackShape { depth, height, width }
    }

    /// The same planes, `depth` of them.
    pub fn with_depth(self, depth: usize) -> Self {
        StackShape { depth, ..self }
    }
}

impl fmt::Display for StackShape {
    /// "2 planes of 64×64 pixels" (rows × columns).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let s = if self.depth == 1 { "" } else { "s" };
        write!(f, "{} plane{s} of {}×{} pixels", self.depth, self.height, self.width)
    }
}

/// What an [`ArgCheck`] found wrong: the argument, the problem and its fix
/// (e.g. `size`, "size must be odd, got 4", "use 3 or 5"). `arg` is `None`
/// when no argument is to blame: the stack cannot work whatever the arguments
/// (too few planes for a fit).
#[derive(Debug, Clone, PartialEq)]
pub struct ArgProblem {
    pub arg: Option<&'static str>,
    pub problem: String,
    pub fix: String,
}

impl ArgProblem {
    /// A problem with argument `arg`.
    pub fn new(arg: &'static str, problem: impl Into<String>, fix: impl Into<String>) -> Self {
        ArgProblem { arg: Some(arg), problem: problem.into(), fix: fix.into() }
    }

    /// A problem with the input stack itself, whatever the arguments.
    pub fn input(problem: impl Into<String>, fix: impl Into<String>) -> Self {
        ArgProblem { arg: None, problem: problem.into(), fix: fix.into() }
    }
}

/// A function's declaration-level check: refuses arguments that cannot work
/// for a stack of this shape (or for any stack), before any pixel is read.
/// The shape is the one the *call* receives (depth 1 for per-plane calls).
/// Compile runs it for every call of every chain with the shape the call will
/// get; [`Registry::execute_in`](crate::Registry::execute_in) runs it again on the real stack as a defence.
/// Declared typed, as [`FunctionDecl::check`](crate::FunctionDecl); stored in this form.
pub type ArgCheck = Arc<dyn Fn(&Args, &StackShape) -> Result<(), ArgProblem> + Send + Sync>;

/// The shape a function returns for an input stack of a shape (the whole
/// stack, not the per-plane call), when arguments and shape decide it; `None`
/// when only the run knows it. See [`Function::output_shape`](crate::registry::Function::output_shape) for the default.
/// Declared typed, as [`FunctionDecl::output_shape`](crate::FunctionDecl); stored in this form.
pub type ShapeRule = Arc<dyn Fn(&Args, &StackShape) -> Option<StackShape> + Send + Sync>;

/// An output-shape rule for functions that keep the stack's shape.
pub fn same_shape<A>(_: &A, input: &StackShape) -> Option<StackShape> {
    Some(*input)
}

/// An output-shape rule for N → 1 reductions that keep the plane size (projections, composites).
pub fn one_plane<A>(_: &A, input: &StackShape) -> Option<StackShape> {
    Some(input.with_depth(1))
}

/// Validated arguments of one call: every declared argument has a value.
///
/// Functions declared in Rust read them through their typed struct
/// ([`FunctionArgs`], declared with [`function_args!`](crate::function_args));
/// functions registered at run time see the values by name, where an
/// undeclared name is `None`, never a made-up 0.
#[derive(Debug, Clone, PartialEq, Default, Serialize)]
pub struct Args {
    values: BTreeMap<String, ArgValue>,
}

impl Args {
    pub(crate) fn new(values: BTreeMap<String, ArgValue>) -> Self {
        Args { values }
    }

    /// The value of argument `name`; `None` when the function does not declare it.
    pub fn get(&self, name: &str) -> Option<&ArgValue> {
        self.values.get(name)
    }

    /// The value of a boolean argument the registry itself declares (`slice_by_slice`).
    pub(crate) fn flag(&self, name: &str) -> bool {
        matches!(self.values.get(name), Some(ArgValue::Bool(true)))
    }
}

/// The typed arguments of one function: its argument declarations and how a
/// validated [`Args`] becomes the struct. Written by [`function_args!`](crate::function_args)
/// from one definition, so a field and its declared argument cannot drift apart,
/// and an implementation cannot read an argument its function does not declare.
pub trait FunctionArgs: Sized + Send + Sync + 'static {
    /// The declared arguments, in the order `hcsflow functions` lists them.
    fn arg_specs() -> Vec<ArgSpec>;
    /// The struct for validated arguments (a value missing from `args` takes its declared default).
    fn from_args(args: &Args) -> Self;
}

/// The arguments of a function that has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct NoArgs;

impl FunctionArgs for NoArgs {
    fn arg_specs() -> Vec<ArgSpec> {
        Vec::new()
    }
    fn from_args(_: &Args) -> Self {
        NoArgs
    }
}

/// A Rust type an argument value can be read as.
pub trait ArgType: Sized + Default {
    /// The value as this type, if it is of this type (an integer is read as a float).
    fn from_value(value: &ArgValue) -> Option<Self>;
}

/// `impl ArgType for $type`: the value of variant `ArgValue::$variant`, by `$read`.
macro_rules! arg_type {
    ($type:ty, $variant:ident, $read:expr) => {
        impl ArgType for $type {
            fn from_value(value: &ArgValue) -> Option<Self> {
                match value {
                    ArgValue::$variant(v) => Some($read(v)),
                    _ => None,
                }
            }
        }
    };
}

arg_type!(i64, Int, |v: &i64| *v);
arg_type!(bool, Bool, |v: &bool| *v);
arg_type!(String, Str, |v: &String| v.clone());
arg_type!(Vec<f64>, FloatList, |v: &Vec<f64>| v.clone());

impl ArgType for f64 {
    fn from_value(value: &ArgValue) -> Option<Self> {
        match value {
            ArgValue::Float(v) => Some(*v),
            ArgValue::Int(v) => Some(*v as f64),
            _ => None,
        }
    }
}

/// One declared argument whose values are read as `T`: an [`ArgSpec`] whose
/// kind matches the field type (`int` → `i64`, `float` → `f64`, `bool`,
/// `choice` → `String`, `float_list` → `Vec<f64>`; another pairing does not
/// compile). Used by [`function_args!`](crate::function_args).
///
/// ```compile_fail
/// hcsflow_core::function_args! {
///     pub struct Wrong {
///         sigma: i64 = float(1.0, None, None, "a float read as an integer"),
///     }
/// }
/// ```
#[derive(Debug, Clone)]
pub struct ArgDecl<T> {
    spec: ArgSpec,
    _type: PhantomData<fn() -> T>,
}

impl<T> ArgDecl<T> {
    fn of(spec: ArgSpec) -> Self {
        ArgDecl { spec, _type: PhantomData }
    }

    pub fn into_spec(self) -> ArgSpec {
        self.spec
    }
}

impl<T: ArgType> ArgDecl<T> {
    /// This argument's value in validated `args` (its declared default when absent).
    pub fn read(&self, args: &Args) -> T {
        args.get(self.spec.name).and_then(T::from_value).or_else(|| T::from_value(&self.spec.default)).unwrap_or_default()
    }
}

impl ArgDecl<i64> {
    pub fn int(name: &'static str, default: i64, min: Option<i64>, max: Option<i64>, doc: &'static str) -> Self {
        ArgDecl::of(ArgSpec::int(name, default, min, max, doc))
    }
}

impl ArgDecl<f64> {
    pub fn float(name: &'static str, default: f64, min: Option<f64>, max: Option<f64>, doc: &'static str) -> Self {
        ArgDecl::of(ArgSpec::float(name, default, min, max, doc))
    }
}

impl ArgDecl<bool> {
    pub fn bool(name: &'static str, default: bool, doc: &'static str) -> Self {
        ArgDecl::of(ArgSpec::bool(name, default, doc))
    }
}

impl ArgDecl<String> {
    pub fn choice(name: &'static str, default: &'static str, choices: &[&'static str], doc: &'static str) -> Self {
        ArgDecl::of(ArgSpec::choice(name, default, choices, doc))
    }

    pub fn text(name: &'static str, default: &'static str, doc: &'static str) -> Self {
        ArgDecl::of(ArgSpec::text(name, default, doc))
    }
}

impl ArgDecl<Vec<f64>> {
    pub fn float_list(
        name: &'static str,
        default: Vec<f64>,
        min: Option<f64>,
        max: Option<f64>,
        min_len: usize,
        doc: &'static str,
    ) -> Self {
        ArgDecl::of(ArgSpec::float_list(name, default, min, max, min_len, doc))
    }
}

/// Declares the typed arguments of a function from one definition: the
/// struct (one public field per argument, named as the argument), its
/// [`ArgSpec`]s in field order and its parsing, as a [`FunctionArgs`] impl.
///
/// Each field is `name: type = kind(…)`, where `kind(…)` takes the arguments of
/// the [`ArgSpec`] constructor of that name without the name; the type must
/// match the kind (see [`ArgDecl`]). A last field `..name: Type` embeds the
/// arguments of another [`FunctionArgs`] struct after these (two functions
/// sharing a group of arguments).
///
/// ```
/// hcsflow_core::function_args! {
///     /// Arguments of `scale`.
///     pub struct ScaleArgs {
///         factor: f64 = float(2.0, Some(0.0), Some(10.0), "multiplier"),
///         mode: String = choice("fast", &["fast", "exact"], "algorithm"),
///     }
/// }
/// use hcsflow_core::FunctionArgs;
/// let specs = ScaleArgs::arg_specs();
/// assert_eq!((specs[0].name, specs[1].name), ("factor", "mode"));
/// let args = ScaleArgs::from_args(&Default::default());
/// assert_eq!(args, ScaleArgs { factor: 2.0, mode: "fast".into() });
/// ```
#[macro_export]
macro_rules! function_args {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident {
            $(
                $(#[$field_meta:meta])*
                $field:ident : $ty:ty = $kind:ident ( $($spec:expr),* $(,)? )
            ),* $(,)?
            $(
                $(#[$flat_meta:meta])*
                .. $flat:ident : $flat_ty:ty $(,)?
            )?
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        $vis struct $name {
            $( $(#[$field_meta])* pub $field: $ty, )*
            $( $(#[$flat_meta])* pub $flat: $flat_ty, )?
        }

        impl $crate::FunctionArgs for $name {
            fn arg_specs() -> ::std::vec::Vec<$crate::ArgSpec> {
                #[allow(unused_mut)]
                let mut specs = ::std::vec![ $( $crate::ArgDecl::<$ty>::$kind(::std::stringify!($field), $($spec),*).into_spec() ),* ];
                $( specs.extend(<$flat_ty as $crate::FunctionArgs>::arg_specs()); )?
                specs
            }

            #[allow(unused_variables)]
            fn from_args(args: &$crate::Args) -> Self {
                $name {
                    $( $field: $crate::ArgDecl::<$ty>::$kind(::std::stringify!($field), $($spec),*).read(args), )*
                    $( $flat: <$flat_ty as $crate::FunctionArgs>::from_args(args), )?
                }
            }
        }
    };
}

/// The closest candidate by edit distance, if it is plausibly a typo.
pub fn closest<'a>(word: &str, candidates: impl Iterator<Item = &'a str>) -> Option<String> {
    candidates
        .map(|c| (edit_distance(word, c), c))
        .filter(|(d, c)| *d <= 2.max(c.len() / 3))
        .min_by_key(|(d, _)| *d)
        .map(|(_, c)| c.to_string())
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            cur[j + 1] = (prev[j] + usize::from(ca != *cb)).min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}
