//! Opera Phenix file names, both directions: [`parse_phenix_name`] reads an
//! image file name, [`PhenixName::file_name`] writes one; [`INDEX_NAMES`] are
//! the index file names.

/// Index file names, in the order they are looked for.
pub const INDEX_NAMES: [&str; 3] = ["Index.idx.xml", "Index.ref.xml", "Index.xml"];

/// Components of a Phenix image file name `r01c02f03p04-ch2sk1fk1fl1.tiff`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhenixName {
    pub row: u32,
    pub col: u32,
    pub field: u32,
    pub plane: u32,
    pub channel: u32,
    /// Time point + 1.
    pub sk: u32,
    pub fk: u32,
    pub fl: u32,
}

impl PhenixName {
    /// The file name Harmony writes for these components, the inverse of
    /// [`parse_phenix_name`]: `r01c02f03p04-ch2sk1fk1fl1.tiff` (row and column
    /// two digits, field and plane at least two).
    pub fn file_name(&self) -> String {
        let PhenixName { row, col, field, plane, channel, sk, fk, fl } = *self;
        format!("r{row:02}c{col:02}f{field:02}p{plane:02}-ch{channel}sk{sk}fk{fk}fl{fl}.tiff")
    }
}

/// Parses a Phenix file name (case-insensitive); `None` if it is not one.
pub fn parse_phenix_name(name: &str) -> Option<PhenixName> {
    let lower = name.to_ascii_lowercase();
    let stem = lower.strip_suffix(".tiff").or_else(|| lower.strip_suffix(".tif"))?;
    let mut rest = stem;
    let mut take = |tag: &str, min: usize, max: usize| -> Option<u32> {
        let r = rest.strip_prefix(tag)?;
        let n = r.bytes().take_while(u8::is_ascii_digit).count();
        if n < min || n > max {
            return None;
        }
        let v = r[..n].parse().ok()?;
        rest = &r[n..];
        Some(v)
    };
    let row = take("r", 2, 2)?;
    let col = take("c", 2, 2)?;
    let field = take("f", 2, 3)?;
    let plane = take("p", 2, 3)?;
    let channel = take("-ch", 1, 3)?;
    let sk = take("sk", 1, 6)?;
    let fk = take("fk", 1, 6)?;
    let fl = take("fl", 1, 6)?;
    if !rest.is_empty() {
        return None;
    }
    Some(PhenixName { row, col, field, plane, channel, sk, fk, fl })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phenix_names() {
        let n = parse_phenix_name("r01c02f03p04-ch2sk5fk1fl1.tiff").unwrap();
        assert_eq!((n.row, n.col, n.field, n.plane, n.channel, n.sk), (1, 2, 3, 4, 2, 5));
        assert_eq!(parse_phenix_name("R16C24F101P01-CH1SK1FK1FL1.TIF").map(|n| n.field), Some(101));
        for bad in ["r1c02f03p04-ch2sk5fk1fl1.tiff", "r01c02f03p04-ch2sk5fk1fl1.png", "r01c02f03p04-ch2sk5fk1.tiff", "x.tiff"] {
            assert_eq!(parse_phenix_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn written_names_parse_back() {
        for field in [1, 12, 101] {
            let n = PhenixName { row: 3, col: 14, field, plane: 2, channel: 4, sk: 7, fk: 1, fl: 1 };
            assert_eq!(parse_phenix_name(&n.file_name()), Some(n));
        }
        let n = PhenixName { row: 1, col: 2, field: 101, plane: 4, channel: 2, sk: 1, fk: 1, fl: 1 };
        assert_eq!(n.file_name(), "r01c02f101p04-ch2sk1fk1fl1.tiff");
    }
}
