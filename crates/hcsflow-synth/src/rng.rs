//! A small deterministic PRNG (xoshiro256++ seeded by SplitMix64) and the few
//! distributions the generator needs. Own code rather than a dependency so the
//! byte-exact output for a seed can never change with a crate upgrade.

/// SplitMix64 step: a strong 64-bit mixer, used to derive independent seeds.
pub fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A seed derived from a base seed and a list of labels (well, site, …), so every
/// tile has its own stream regardless of the order tiles are generated in.
pub fn derive(seed: u64, parts: &[u64]) -> u64 {
    parts.iter().fold(mix(seed), |acc, &p| mix(acc ^ mix(p)))
}

/// xoshiro256++.
#[derive(Debug, Clone)]
pub struct Rng {
    s: [u64; 4],
    spare: Option<f64>,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut s = [0u64; 4];
        for v in &mut s {
            x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
            *v = mix(x);
        }
        Rng { s, spare: None }
    }

    #[inline]
    pub fn next_u64(&mut self) -> u64 {
        let result = (self.s[0].wrapping_add(self.s[3])).rotate_left(23).wrapping_add(self.s[0]);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    #[inline]
    pub fn uniform(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: f64, hi: f64) -> f64 {
        lo + (hi - lo) * self.uniform()
    }

    /// Standard normal (Marsaglia polar method, caching the second value).
    #[inline]
    pub fn normal(&mut self) -> f64 {
        if let Some(v) = self.spare.take() {
            return v;
        }
        loop {
            let u = 2.0 * self.uniform() - 1.0;
            let v = 2.0 * self.uniform() - 1.0;
            let s = u * u + v * v;
            if s > 0.0 && s < 1.0 {
                let m = (-2.0 * s.ln() / s).sqrt();
                self.spare = Some(v * m);
                return u * m;
            }
        }
    }

    /// Poisson(λ): exact (multiplication method) below λ = 30, normal
    /// approximation above, where the difference is far below the read noise.
    #[inline]
    pub fn poisson(&mut self, lambda: f64) -> f64 {
        if lambda <= 0.0 {
            return 0.0;
        }
        if lambda < 30.0 {
            let l = (-lambda).exp();
            let mut k = 0.0;
            let mut p = self.uniform();
            while p > l {
                k += 1.0;
                p *= self.uniform();
            }
            k
        } else {
            (lambda + lambda.sqrt() * self.normal()).max(0.0)
        }
    }

    /// A random GUID-shaped string (upper-case hex, 8-4-4-4-12).
    pub fn guid(&mut self) -> String {
        let a = self.next_u64();
        let b = self.next_u64();
        format!("{:08X}-{:04X}-{:04X}-{:04X}-{:012X}", a >> 32, (a >> 16) & 0xFFFF, a & 0xFFFF, b >> 48, b & 0xFFFF_FFFF_FFFF)
    }
}

/// Inverse of the standard normal CDF (Acklam's rational approximation,
/// relative error below 1.2e-9), for `p` in (0, 1).
#[allow(clippy::excessive_precision)] // the published coefficients, verbatim
pub fn inv_norm_cdf(p: f64) -> f64 {
    const A: [f64; 6] =
        [-3.969683028665376e1, 2.209460984245205e2, -2.759285104469687e2, 1.383577518672690e2, -3.066479806614716e1, 2.506628277459239];
    const B: [f64; 5] = [-5.447609879822406e1, 1.615858368580409e2, -1.556989798598866e2, 6.680131188771972e1, -1.328068155288572e1];
    const C: [f64; 6] =
        [-7.784894002430293e-3, -3.223964580411365e-1, -2.400758277161838, -2.549732539343734, 4.374664141464968, 2.938163982698783];
    const D: [f64; 4] = [7.784695709041462e-3, 3.224671290700398e-1, 2.445134137142996, 3.754408661907416];
    let tail = |q: f64| {
        (((((C[0] * q + C[1]) * q + C[2]) * q + C[3]) * q + C[4]) * q + C[5]) / ((((D[0] * q + D[1]) * q + D[2]) * q + D[3]) * q + 1.0)
    };
    if p < 0.02425 {
        tail((-2.0 * p.ln()).sqrt())
    } else if p > 1.0 - 0.02425 {
        -tail((-2.0 * (1.0 - p).ln()).sqrt())
    } else {
        let q = p - 0.5;
        let r = q * q;
        (((((A[0] * r + A[1]) * r + A[2]) * r + A[3]) * r + A[4]) * r + A[5]) * q
            / (((((B[0] * r + B[1]) * r + B[2]) * r + B[3]) * r + B[4]) * r + 1.0)
    }
}

/// Standard normal values at the 65 536 equiprobable quantiles: indexing it
/// with 16 random bits is a fast normal draw (used for pixel noise, where the
/// quantisation to 2^16 levels and the ±4.3σ range are irrelevant).
pub fn normal_table() -> &'static [f32] {
    static TABLE: std::sync::OnceLock<Vec<f32>> = std::sync::OnceLock::new();
    TABLE.get_or_init(|| (0..65536).map(|i| inv_norm_cdf((f64::from(i) + 0.5) / 65536.0) as f32).collect())
}

#[cfg(test)]
mod tests {
    #[test]
    fn normal_table_is_standard_normal() {
        let t = normal_table();
        let mean = t.iter().map(|&x| f64::from(x)).sum::<f64>() / t.len() as f64;
        let var = t.iter().map(|&x| f64::from(x).powi(2)).sum::<f64>() / t.len() as f64;
        assert!(mean.abs() < 1e-6 && (var - 1.0).abs() < 2e-3, "{mean} {var}");
        assert!((inv_norm_cdf(0.975) - 1.959964).abs() < 1e-5);
    }

    use super::*;

    #[test]
    fn deterministic_and_distinct_streams() {
        let a: Vec<u64> = (0..4).map(|_| Rng::new(7).next_u64()).collect();
        assert!(a.windows(2).all(|w| w[0] == w[1]));
        assert_ne!(derive(1, &[2, 3]), derive(1, &[3, 2]));
        assert_ne!(Rng::new(derive(1, &[0])).next_u64(), Rng::new(derive(1, &[1])).next_u64());
    }

    #[test]
    fn moments_are_right() {
        let mut r = Rng::new(42);
        let n = 200_000;
        let xs: Vec<f64> = (0..n).map(|_| r.normal()).collect();
        let mean = xs.iter().sum::<f64>() / n as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n as f64;
        assert!(mean.abs() < 0.01 && (var - 1.0).abs() < 0.02, "{mean} {var}");
        for lambda in [3.0, 100.0] {
            let ps: Vec<f64> = (0..n).map(|_| r.poisson(lambda)).collect();
            let m = ps.iter().sum::<f64>() / n as f64;
            let v = ps.iter().map(|x| (x - m).powi(2)).sum::<f64>() / n as f64;
            assert!((m - lambda).abs() < 0.02 * lambda && (v - lambda).abs() < 0.05 * lambda, "{lambda}: {m} {v}");
        }
    }

    #[test]
    fn guid_shape() {
        let g = Rng::new(1).guid();
        assert_eq!(g.len(), 36);
        assert_eq!(g.as_bytes()[8], b'-');
    }
}
