//! Minimal `.npy` (NumPy format 1.0–3.0) reader and writer for 2D/3D arrays
//! of u8, u16, f32 (and f64, read as f32): what the benchmark inputs and
//! reference outputs are stored as.

use std::io::Write;
use std::path::{Path, PathBuf};

use hcsflow_core::{DType, Stack};
use hcsflow_io::Durability;
use ndarray::Array3;

#[derive(Debug, thiserror::Error)]
pub enum NpyError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{path}: not a .npy file or unsupported header: {reason}")]
    Format { path: PathBuf, reason: String },
}

fn format_error(path: &Path, reason: impl Into<String>) -> NpyError {
    NpyError::Format { path: path.to_path_buf(), reason: reason.into() }
}

/// Value of `'key': value` in the header dict (value up to the next top-level comma or brace).
fn header_value<'a>(header: &'a str, key: &str) -> Option<&'a str> {
    let start = header.find(&format!("'{key}'"))? + key.len() + 2;
    let rest = header[start..].trim_start().strip_prefix(':')?.trim_start();
    let end = if rest.starts_with('(') { rest.find(')')? + 1 } else { rest.find([',', '}'])? };
    Some(rest[..end].trim())
}

/// Reads a C-ordered 2D (`[Y, X]` → one plane) or 3D `[Z, Y, X]` array.
/// Little-endian `u1`, `u2`, `f4` keep their dtype; `f8` is converted to f32.
pub fn read_npy(path: &Path) -> Result<Stack, NpyError> {
    let bytes = std::fs::read(path).map_err(|source| NpyError::Io { path: path.to_path_buf(), source })?;
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(format_error(path, "missing \\x93NUMPY magic"));
    }
    let (header_len, offset) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        2 | 3 if bytes.len() >= 12 => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
        v => return Err(format_error(path, format!("format version {v}"))),
    };
    let header = bytes
        .get(offset..offset + header_len)
        .and_then(|h| std::str::from_utf8(h).ok())
        .ok_or_else(|| format_error(path, "truncated header"))?;
    let descr = header_value(header, "descr").ok_or_else(|| format_error(path, "no descr"))?.trim_matches(['\'', '"']);
    if header_value(header, "fortran_order") != Some("False") {
        return Err(format_error(path, "only C-ordered arrays are supported"));
    }
    let shape_text = header_value(header, "shape").ok_or_else(|| format_error(path, "no shape"))?;
    let shape: Vec<usize> = shape_text
        .trim_matches(['(', ')'])
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| s.parse::<usize>().map_err(|_| format_error(path, format!("bad shape {shape_text}"))))
        .collect::<Result<_, _>>()?;
    let dims = match shape.as_slice() {
        [y, x] => (1, *y, *x),
        [z, y, x] => (*z, *y, *x),
        _ => return Err(format_error(path, format!("shape {shape:?}: expected 2 or 3 axes"))),
    };
    let data = &bytes[offset + header_len..];
    let n = dims.0 * dims.1 * dims.2;
    let (size, dtype) = match descr {
        "|u1" | "<u1" => (1, Some(DType::U8)),
        "<u2" => (2, Some(DType::U16)),
        "<f4" => (4, Some(DType::F32)),
        "<f8" => (8, None),
        other => return Err(format_error(path, format!("dtype {other}: expected |u1, <u2, <f4 or <f8"))),
    };
    if data.len() < n * size {
        return Err(format_error(path, format!("data holds {} bytes, shape needs {}", data.len(), n * size)));
    }
    let data = &data[..n * size];
    let shape_err = |_| format_error(path, "shape does not match data");
    Ok(match dtype {
        Some(DType::U8) => Stack::from(Array3::from_shape_vec(dims, data.to_vec()).map_err(shape_err)?),
        Some(DType::U16) => Stack::from(
            Array3::from_shape_vec(dims, data.chunks_exact(2).map(|c| u16::from_le_bytes([c[0], c[1]])).collect()).map_err(shape_err)?,
        ),
        Some(DType::F32) => Stack::from(
            Array3::from_shape_vec(dims, data.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
                .map_err(shape_err)?,
        ),
        None => Stack::from(
            Array3::from_shape_vec(
                dims,
                data.chunks_exact(8).map(|c| f64::from_le_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]) as f32).collect(),
            )
            .map_err(shape_err)?,
        ),
    })
}

/// Writes a stack as a 3D `.npy` (format 1.0, little-endian), atomically and
/// fsync'ed ([`hcsflow_io::write_atomic_with`]).
pub fn write_npy(path: &Path, stack: &Stack) -> Result<(), NpyError> {
    let descr = match stack.dtype() {
        DType::U8 => "|u1",
        DType::U16 => "<u2",
        DType::F32 => "<f4",
    };
    let [z, y, x] = stack.shape();
    let mut header = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': ({z}, {y}, {x}), }}");
    // Magic (6) + version (2) + length (2) + header + '\n' is a multiple of 64.
    while (10 + header.len() + 1) % 64 != 0 {
        header.push(' ');
    }
    header.push('\n');
    let io = |source| NpyError::Io { path: path.to_path_buf(), source };
    hcsflow_io::write_atomic_with(path, Durability::Fsync, |f| {
        f.write_all(b"\x93NUMPY\x01\x00")?;
        f.write_all(&(header.len() as u16).to_le_bytes())?;
        f.write_all(header.as_bytes())?;
        // Stack bytes are native-endian; every supported target is little-endian.
        f.write_all(stack.as_bytes())
    })
    .map_err(io)
}
