//! Pixel data types and the dtype policy applied to function results.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// The pixel types a [`Stack`](crate::Stack) can hold.
///
/// `U16` is what almost every HCS camera writes; functions keep it native
/// wherever the operation allows (max/min projections, crops, LUT-based
/// normalisation) instead of widening to float.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DType {
    U8,
    U16,
    F32,
}

impl DType {
    /// Every dtype, in a stable order (for listings).
    pub const ALL: [DType; 3] = [DType::U8, DType::U16, DType::F32];

    /// The lower-case name used on the command line and in pipeline files.
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "u8",
            DType::U16 => "u16",
            DType::F32 => "f32",
        }
    }

    /// Bytes per pixel.
    pub fn size_bytes(self) -> usize {
        match self {
            DType::U8 => 1,
            DType::U16 => 2,
            DType::F32 => 4,
        }
    }

    /// The representable range of an integer dtype, `None` for floats.
    pub fn integer_range(self) -> Option<(f32, f32)> {
        match self {
            DType::U8 => Some((0.0, u8::MAX as f32)),
            DType::U16 => Some((0.0, u16::MAX as f32)),
            DType::F32 => None,
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Error for a dtype name that is not one of `u8`, `u16`, `f32`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown dtype '{0}': expected one of u8, u16, f32")]
pub struct UnknownDType(pub String);

impl FromStr for DType {
    type Err = UnknownDType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "u8" | "uint8" => Ok(DType::U8),
            "u16" | "uint16" => Ok(DType::U16),
            "f32" | "float32" => Ok(DType::F32),
            _ => Err(UnknownDType(s.to_string())),
        }
    }
}

/// How a float result is brought back into an integer dtype.
///
/// The default is [`Clip`](DTypeConversion::Clip): values keep their meaning and
/// out-of-range values saturate, so intensities stay comparable between wells.
/// OpenHCS instead stretches each call's min..max to the full range; that is
/// available as [`Stretch`](DTypeConversion::Stretch) but only when asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DTypeConversion {
    /// Round to nearest (ties to even), then saturate to the target range. NaN becomes 0.
    #[default]
    Clip,
    /// Map the stack's min..max linearly onto the target range, then round.
    /// A constant stack maps to 0.
    Stretch,
}

impl FromStr for DTypeConversion {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "clip" => Ok(DTypeConversion::Clip),
            "stretch" => Ok(DTypeConversion::Stretch),
            _ => Err(format!("unknown dtype conversion '{s}': expected 'clip' or 'stretch'")),
        }
    }
}

/// Which dtype a step's result is delivered in.
///
/// `Input` (the default) means "the dtype of the stack the step received":
/// a mean projection of u16 planes yields u16 unless the step asks for `f32`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub enum OutputDType {
    #[default]
    Input,
    Fixed(DType),
}

impl OutputDType {
    /// The concrete dtype for a stack whose input dtype was `input`.
    pub fn resolve(self, input: DType) -> DType {
        match self {
            OutputDType::Input => input,
            OutputDType::Fixed(d) => d,
        }
    }
}

impl FromStr for OutputDType {
    type Err = UnknownDType;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "input" {
            Ok(OutputDType::Input)
        } else {
            s.parse().map(OutputDType::Fixed).map_err(|_| UnknownDType(s.to_string()))
        }
    }
}

/// The dtype policy of one function call: which dtype, and how floats get there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
pub struct DTypePolicy {
    pub output: OutputDType,
    pub conversion: DTypeConversion,
}
