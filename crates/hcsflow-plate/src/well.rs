//! Well names (`A01`, `AF48`) and plate geometry.
//!
//! Rows are letters, 1-based: `A`..`Z` are rows 1..26, then `AA`..`AZ` are
//! rows 27..52 (a 1536-well plate has 32 rows, `A`..`AF`). Columns are two
//! digits, 1-based. Ordering of wells is always by row, then column, numerically
//! — never as text, which would put `AA01` before `B01`.

use std::cmp::Ordering;

/// Row letters of a 1-based row number: 1 → `A`, 26 → `Z`, 27 → `AA`, 32 → `AF`.
/// Returns `None` for 0 or rows beyond `AZ` (52), which no plate has.
pub fn row_letters(row: u32) -> Option<String> {
    match row {
        1..=26 => Some(char::from(b'A' + (row - 1) as u8).to_string()),
        27..=52 => Some(format!("A{}", char::from(b'A' + (row - 27) as u8))),
        _ => None,
    }
}

/// The well name of a 1-based (row, column): (2, 2) → `B02`, (32, 48) → `AF48`.
pub fn well_name(row: u32, col: u32) -> Option<String> {
    if col == 0 || col > 99 {
        return None;
    }
    Some(format!("{}{:02}", row_letters(row)?, col))
}

/// Parses a well name into 1-based (row, column). Accepts one or two upper-case
/// row letters and a two-digit column (`A01`, `P24`, `AF48`). Anything else → `None`.
pub fn parse_well(name: &str) -> Option<(u32, u32)> {
    let b = name.as_bytes();
    let letters = b.iter().take_while(|c| c.is_ascii_uppercase()).count();
    if !(1..=2).contains(&letters) || b.len() != letters + 2 {
        return None;
    }
    if !b[letters..].iter().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let row = if letters == 1 {
        u32::from(b[0] - b'A') + 1
    } else {
        if b[0] != b'A' {
            return None;
        }
        u32::from(b[1] - b'A') + 27
    };
    let col: u32 = name[letters..].parse().ok()?;
    if col == 0 {
        return None;
    }
    Some((row, col))
}

/// Numeric well order (row, then column). Unparseable names sort after all
/// valid ones, as text among themselves.
pub fn cmp_wells(a: &str, b: &str) -> Ordering {
    match (parse_well(a), parse_well(b)) {
        (Some(x), Some(y)) => x.cmp(&y),
        (Some(_), None) => Ordering::Less,
        (None, Some(_)) => Ordering::Greater,
        (None, None) => a.cmp(b),
    }
}

/// (rows, columns) of a standard plate with `wells` wells (6..1536), if standard.
pub fn plate_dimensions(wells: u32) -> Option<(u32, u32)> {
    match wells {
        6 => Some((2, 3)),
        12 => Some((3, 4)),
        24 => Some((4, 6)),
        48 => Some((6, 8)),
        96 => Some((8, 12)),
        384 => Some((16, 24)),
        1536 => Some((32, 48)),
        _ => None,
    }
}

/// (rows, columns) of the smallest plate of 6, 24, 96, 384 or 1536 wells
/// holding a well at 1-based `row` and `col`; `(row, col)` itself when no
/// such plate does.
pub fn smallest_plate(row: u32, col: u32) -> (u32, u32) {
    [(2, 3), (4, 6), (8, 12), (16, 24), (32, 48)].into_iter().find(|(pr, pc)| row <= *pr && col <= *pc).unwrap_or((row, col))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_including_two_letter_rows() {
        for row in 1..=32 {
            for col in [1, 9, 48] {
                let n = well_name(row, col).unwrap();
                assert_eq!(parse_well(&n), Some((row, col)), "{n}");
            }
        }
        assert_eq!(well_name(32, 48).as_deref(), Some("AF48"));
        assert_eq!(well_name(27, 1).as_deref(), Some("AA01"));
        assert_eq!(parse_well("B02"), Some((2, 2)));
    }

    #[test]
    fn rejects_malformed_wells() {
        for bad in ["", "A1", "A001", "a01", "BA01", "A00", "01", "ABC01", "A0x"] {
            assert_eq!(parse_well(bad), None, "{bad}");
        }
    }

    #[test]
    fn numeric_order() {
        let mut w = vec!["AA01", "B01", "A10", "A02", "Z24"];
        w.sort_by(|a, b| cmp_wells(a, b));
        assert_eq!(w, ["A02", "A10", "B01", "Z24", "AA01"]);
    }
}
