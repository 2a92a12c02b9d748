//! Every `ImageDescription` (tag 270) of page 0, in file order.
//!
//! A TIFF may hold the tag more than once: tifffile writes its own JSON
//! description after the one its caller gives (a MetaSeries XML, say), and
//! readers that keep one entry per tag see only the last. TIFF 6.0 IFDs are
//! a count followed by fixed-size entries (12 bytes: tag u16, type u16,
//! count u32, value-or-offset u32; BigTIFF: 20 bytes with u64 count and
//! offset, TIFF 6.0 §2 and the BigTIFF specification), so the entries are
//! read here directly.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::Path;

const IMAGE_DESCRIPTION: u16 = 270;
/// The TIFF types a description may have: ASCII, BYTE, UNDEFINED.
const TEXT_TYPES: [u16; 3] = [2, 1, 7];

/// The text of every ImageDescription entry of page 0, in file order, each
/// up to its first NUL. Anything that does not parse (not a TIFF, an entry
/// pointing past the end) ends the list early rather than failing: the
/// decoder reports structural damage.
pub fn page0_descriptions(path: &Path) -> Vec<String> {
    read_descriptions(path).unwrap_or_default()
}

fn read_descriptions(path: &Path) -> std::io::Result<Vec<String>> {
    let mut file = File::open(path)?;
    let len = file.metadata()?.len();
    let mut header = [0u8; 16];
    file.read_exact(&mut header[..8])?;
    let little = match &header[..2] {
        b"II" => true,
        b"MM" => false,
        _ => return Ok(Vec::new()),
    };
    let u16_at = |b: &[u8]| if little { u16::from_le_bytes([b[0], b[1]]) } else { u16::from_be_bytes([b[0], b[1]]) };
    let u32_at = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3]];
        if little {
            u32::from_le_bytes(a)
        } else {
            u32::from_be_bytes(a)
        }
    };
    let u64_at = |b: &[u8]| {
        let a = [b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]];
        if little {
            u64::from_le_bytes(a)
        } else {
            u64::from_be_bytes(a)
        }
    };
    let big = match u16_at(&header[2..4]) {
        42 => false,
        43 => true,
        _ => return Ok(Vec::new()),
    };
    let ifd = if big {
        file.read_exact(&mut header[8..16])?;
        u64_at(&header[8..16])
    } else {
        u64::from(u32_at(&header[4..8]))
    };
    let (count_size, entry_size, inline) = if big { (8, 20, 8) } else { (2, 12, 4) };
    if ifd + count_size > len {
        return Ok(Vec::new());
    }
    file.seek(SeekFrom::Start(ifd))?;
    let mut count_bytes = [0u8; 8];
    file.read_exact(&mut count_bytes[..count_size as usize])?;
    let entries = if big { u64_at(&count_bytes) } else { u64::from(u16_at(&count_bytes)) };
    if ifd + count_size + entries * entry_size > len {
        return Ok(Vec::new());
    }
    let mut table = vec![0u8; (entries * entry_size) as usize];
    file.read_exact(&mut table)?;
    let mut found = Vec::new();
    for entry in table.chunks_exact(entry_size as usize) {
        let (tag, kind) = (u16_at(&entry[0..2]), u16_at(&entry[2..4]));
        if tag != IMAGE_DESCRIPTION || !TEXT_TYPES.contains(&kind) {
            continue;
        }
        let (n, value) = if big { (u64_at(&entry[4..12]), &entry[12..20]) } else { (u64::from(u32_at(&entry[4..8])), &entry[8..12]) };
        let bytes = if n <= inline {
            value[..n as usize].to_vec()
        } else {
            let offset = if big { u64_at(value) } else { u64::from(u32_at(value)) };
            if offset.checked_add(n).is_none_or(|end| end > len) {
                break;
            }
            let mut bytes = vec![0u8; n as usize];
            file.seek(SeekFrom::Start(offset))?;
            file.read_exact(&mut bytes)?;
            bytes
        };
        let text = bytes.split(|&b| b == 0).next().unwrap_or_default();
        found.push(String::from_utf8_lossy(text).into_owned());
    }
    Ok(found)
}
