//! Kernels compiled for several x86-64 instruction sets and chosen at run
//! time: the workspace builds for baseline x86-64 (SSE2), where the hot loops
//! of the fit and the resize run 4 lanes wide; AVX2 gives 8, AVX-512 16.
//! Rust never contracts `a·b + c` into a fused multiply-add, so every build
//! computes the same values.

/// The instruction set the kernels run with ([`Isa::detect`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    Portable,
    #[cfg(target_arch = "x86_64")]
    Avx2,
    #[cfg(target_arch = "x86_64")]
    Avx512,
}

impl Isa {
    pub fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx512f") && std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx512;
            }
            if std::arch::is_x86_feature_detected!("avx2") {
                return Isa::Avx2;
            }
        }
        Isa::Portable
    }

    /// Every instruction set this machine can run, the portable one first.
    #[cfg(test)]
    pub fn available() -> Vec<Isa> {
        let mut all = vec![Isa::Portable];
        #[cfg(target_arch = "x86_64")]
        {
            if std::arch::is_x86_feature_detected!("avx2") {
                all.push(Isa::Avx2);
            }
            if Isa::detect() == Isa::Avx512 {
                all.push(Isa::Avx512);
            }
        }
        all
    }
}

/// Defines `pub(crate) fn $name(isa: Isa, args…)` running `$body` compiled
/// for that instruction set.
macro_rules! dispatched {
    ($(#[$doc:meta])* fn $name:ident $(<$g:ident: $bound:path>)? ($($arg:ident: $ty:ty),* $(,)?) $body:block) => {
        dispatched! { $(#[$doc])* fn $name $(<$g: $bound>)? ($($arg: $ty),*) -> () $body }
    };
    ($(#[$doc:meta])* fn $name:ident $(<$g:ident: $bound:path>)? ($($arg:ident: $ty:ty),* $(,)?) -> $ret:ty $body:block) => {
        $(#[$doc])*
        pub(crate) fn $name $(<$g: $bound>)? (isa: $crate::simd::Isa, $($arg: $ty),*) -> $ret {
            #[inline(always)]
            fn portable $(<$g: $bound>)? ($($arg: $ty),*) -> $ret $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx2")]
            fn avx512 $(<$g: $bound>)? ($($arg: $ty),*) -> $ret { portable $(::<$g>)? ($($arg),*) }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            fn avx2 $(<$g: $bound>)? ($($arg: $ty),*) -> $ret { portable $(::<$g>)? ($($arg),*) }
            match isa {
                // SAFETY: `Isa::detect` found the features these are compiled for.
                #[cfg(target_arch = "x86_64")]
                $crate::simd::Isa::Avx512 => unsafe { avx512 $(::<$g>)? ($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                $crate::simd::Isa::Avx2 => unsafe { avx2 $(::<$g>)? ($($arg),*) },
                $crate::simd::Isa::Portable => portable $(::<$g>)? ($($arg),*),
            }
        }
    };
}
pub(crate) use dispatched;
