//! FFT sizes.

/// The smallest `m ≥ n` (and `m ≥ 1`) whose prime factors are all 2, 3, 5
/// or 7 (sizes `rustfft` transforms with its fast butterflies), and even when
/// `even` (a real FFT of even length costs half a complex one of that length).
pub fn next_fast_len(n: usize, even: bool) -> usize {
    let mut m = n.max(1);
    loop {
        if !even || m.is_multiple_of(2) {
            let mut k = m;
            for p in [2, 3, 5, 7] {
                while k.is_multiple_of(p) {
                    k /= p;
                }
            }
            if k == 1 {
                return m;
            }
        }
        m += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fast_lengths() {
        assert_eq!(next_fast_len(519, true), 540);
        assert_eq!(next_fast_len(37, false), 40);
        assert_eq!(next_fast_len(11, false), 12);
        assert_eq!(next_fast_len(13, true), 14);
        assert_eq!(next_fast_len(1, false), 1);
        assert_eq!(next_fast_len(1, true), 2);
        assert_eq!(next_fast_len(0, false), 1);
    }
}
