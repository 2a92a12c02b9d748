//! A TIFF with two ImageDescription tags (as tifffile writes: its caller's
//! description, then its own JSON): `read_info` reports the first.

/// A classic little-endian 1×1 u8 TIFF whose page 0 has the given
/// ImageDescription entries, in order, built byte by byte.
fn tiff_with_descriptions(descriptions: &[&str]) -> Vec<u8> {
    let mut entries: Vec<(u16, u16, u32, u32)> = vec![(256, 3, 1, 1), (257, 3, 1, 1), (258, 3, 1, 8), (259, 3, 1, 1), (262, 3, 1, 1)];
    let n_entries = 5 + descriptions.len() + 4;
    let ifd_len = 2 + 12 * n_entries + 4;
    let mut tail = Vec::new(); // the texts, then the one pixel
    let tail_start = 8 + ifd_len;
    for d in descriptions {
        let offset = (tail_start + tail.len()) as u32;
        tail.extend_from_slice(d.as_bytes());
        tail.push(0);
        entries.push((270, 2, d.len() as u32 + 1, offset));
    }
    let pixel_offset = (tail_start + tail.len()) as u32;
    tail.push(42);
    entries.extend([(273, 4, 1, pixel_offset), (277, 3, 1, 1), (278, 3, 1, 1), (279, 4, 1, 1)]);
    let mut out = b"II*\0".to_vec();
    out.extend_from_slice(&8u32.to_le_bytes());
    out.extend_from_slice(&(n_entries as u16).to_le_bytes());
    for (tag, kind, count, value) in entries {
        out.extend_from_slice(&tag.to_le_bytes());
        out.extend_from_slice(&kind.to_le_bytes());
        out.extend_from_slice(&count.to_le_bytes());
        out.extend_from_slice(&value.to_le_bytes());
    }
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&tail);
    out
}

#[test]
fn the_first_of_two_descriptions_is_the_one_reported() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("two.tif");
    let metaseries = "<MetaData>\r\n<prop id=\"spatial-calibration-x\" type=\"float\" value=\"1.3668\"/>\r\n</MetaData>";
    std::fs::write(&path, tiff_with_descriptions(&[metaseries, "{\"shape\": [1, 1]}"])).unwrap();
    let info = hcsflow_tiff::read_info(&path).unwrap();
    assert_eq!(info.description.as_deref(), Some(metaseries));
    assert_eq!((info.width, info.height, info.pages), (1, 1, 1));
    // The pixel still decodes (the file is a valid TIFF).
    let stack = hcsflow_tiff::read_stack(&path).unwrap();
    assert_eq!(stack.as_bytes(), [42]);
    // One description, or none: as before.
    std::fs::write(&path, tiff_with_descriptions(&["only"])).unwrap();
    assert_eq!(hcsflow_tiff::read_info(&path).unwrap().description.as_deref(), Some("only"));
    std::fs::write(&path, tiff_with_descriptions(&[])).unwrap();
    assert_eq!(hcsflow_tiff::read_info(&path).unwrap().description, None);
}
