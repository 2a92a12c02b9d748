//! Random numbers: a counter-based generator evaluated on the device, and SplitMix64 on the host.
//!
//! Training draws its patch origins, augmentations and mask positions on the device from a
//! counter-based hash of (seed, step, stream, counter): no host→device upload and no device→host
//! read per step, and the same numbers on every backend and thread (burn's own generator is
//! seeded per process and differs between backends). Every intermediate value stays below 2^31,
//! so the hash is exact in the 32-bit integers of GPU backends and the 64-bit ones of `flex`.

use burn::tensor::{Device, Int, Tensor};

/// SplitMix64 (Steele, Lea & Flood 2014): the host generator for weight initialisation and for
/// the per-step keys of the device generator.
#[derive(Debug, Clone)]
pub struct SplitMix64(u64);

impl SplitMix64 {
    /// A generator starting from `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A uniform number in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

/// Number of 16-bit keys one (seed, step, stream) draws.
const KEYS: usize = 5;

/// The 16-bit keys of the device hash for one (seed, step, stream).
fn keys(seed: u64, step: u64, stream: u64) -> [i64; KEYS] {
    let mut g = SplitMix64::new(seed ^ step.wrapping_mul(0xD1B5_4A32_D192_ED03) ^ stream.wrapping_mul(0x8CB9_2BA7_2F3D_8DD7));
    g.next_u64();
    std::array::from_fn(|_| (g.next_u64() & 0xFFFF) as i64)
}

/// A bijective 16-bit mixer (xor-shift, odd multiply mod 2^16, twice): products stay below 2^31.
fn mix16_host(x: u32) -> u32 {
    let x = x ^ (x >> 8);
    let x = (x * 0x6D2B) & 0xFFFF;
    let x = x ^ (x >> 7);
    let x = (x * 0x5BD1) & 0xFFFF;
    x ^ (x >> 9)
}

fn mix16(x: Tensor<1, Int>) -> Tensor<1, Int> {
    let x = x.clone().bitwise_xor(x.bitwise_right_shift_scalar(8));
    let x = x.mul_scalar(0x6D2B).bitwise_and_scalar(0xFFFF);
    let x = x.clone().bitwise_xor(x.bitwise_right_shift_scalar(7));
    let x = x.mul_scalar(0x5BD1).bitwise_and_scalar(0xFFFF);
    x.clone().bitwise_xor(x.bitwise_right_shift_scalar(9))
}

/// The host value of [`DeviceRandom::bits31`] for one counter (the reference of the tests).
pub fn bits31_host(seed: u64, step: u64, stream: u64, counter: u32) -> u32 {
    let k = keys(seed, step, stream).map(|k| k as u32);
    let (lo, hi) = (counter & 0xFFFF, counter >> 16);
    let a = mix16_host(lo ^ k[0]);
    let a = mix16_host(a ^ hi ^ k[1]);
    let a = mix16_host(a ^ k[2]);
    let b = mix16_host(a ^ k[3]);
    let b = mix16_host(b ^ k[4]);
    (a & 0x7FFF) * 65536 + b
}

/// The device generator of one training run: every draw is a pure function of
/// (seed, step, stream, counter).
#[derive(Debug, Clone)]
pub struct DeviceRandom {
    seed: u64,
}

impl DeviceRandom {
    /// The generator of `seed`.
    pub fn new(seed: u64) -> Self {
        Self { seed }
    }

    /// Counters `0..n` on `device` (made once and reused every step).
    pub fn counters(n: usize, device: &Device) -> Tensor<1, Int> {
        Tensor::arange(0..n as i64, device)
    }

    /// 31-bit random integers, one per counter (each counter below 2^31).
    pub fn bits31(&self, counters: Tensor<1, Int>, step: u64, stream: u64) -> Tensor<1, Int> {
        let k = keys(self.seed, step, stream);
        let lo = counters.clone().bitwise_and_scalar(0xFFFF);
        let hi = counters.bitwise_right_shift_scalar(16);
        let a = mix16(lo.bitwise_xor_scalar(k[0]));
        let a = mix16(a.bitwise_xor(hi).bitwise_xor_scalar(k[1]));
        let a = mix16(a.bitwise_xor_scalar(k[2]));
        let b = mix16(a.clone().bitwise_xor_scalar(k[3]));
        let b = mix16(b.bitwise_xor_scalar(k[4]));
        a.bitwise_and_scalar(0x7FFF).mul_scalar(65536).add(b)
    }

    /// Uniform numbers in `[0, 1)`, one per counter.
    pub fn uniform(&self, counters: Tensor<1, Int>, step: u64, stream: u64) -> Tensor<1> {
        // 24 bits: exactly representable in f32, so the result is below 1.
        self.bits31(counters, step, stream).bitwise_right_shift_scalar(7).float().mul_scalar(1.0 / (1u32 << 24) as f64)
    }

    /// Uniform integers in `[0, n)`, one per counter (`1 <= n < 2^31`; bias below n / 2^31).
    pub fn below(&self, counters: Tensor<1, Int>, step: u64, stream: u64, n: usize) -> Tensor<1, Int> {
        self.bits31(counters, step, stream).remainder_scalar(n.max(1) as i64)
    }
}
