//! The random generator of an op: seeded from `DeviceOption.random_seed` when given (the same
//! seed gives the same values), otherwise from a process-wide sequence. One generator per op
//! instance, advancing across runs, as Caffe2's per-op context does.

use std::sync::atomic::{AtomicU64, Ordering};

/// xoshiro256++ seeded through splitmix64.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

fn splitmix(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        let mut x = seed;
        Rng {
            s: [
                splitmix(&mut x),
                splitmix(&mut x),
                splitmix(&mut x),
                splitmix(&mut x),
            ],
        }
    }

    /// Seeded by `seed` if given, else by a fresh process-wide value.
    pub fn from_option(seed: Option<u32>) -> Self {
        static NEXT: AtomicU64 = AtomicU64::new(0x5EED_CAFE);
        match seed {
            Some(s) => Rng::new(s as u64),
            None => {
                let t = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(0);
                Rng::new(t ^ NEXT.fetch_add(0x9E37_79B9, Ordering::Relaxed))
            }
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.s;
        let result = (s[0].wrapping_add(s[3])).rotate_left(23).wrapping_add(s[0]);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1).
    pub fn uniform01(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [lo, hi].
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        let v = lo as f64 + self.uniform01() * (hi as f64 - lo as f64);
        (v as f32).clamp(lo.min(hi), hi.max(lo))
    }

    /// Uniform integer in [lo, hi] (inclusive).
    pub fn uniform_int(&mut self, lo: i64, hi: i64) -> i64 {
        let span = (hi.wrapping_sub(lo) as u64).wrapping_add(1);
        if span == 0 {
            return self.next_u64() as i64;
        }
        lo.wrapping_add((self.next_u64() % span) as i64)
    }

    /// Normal with the given mean and standard deviation (Box-Muller).
    pub fn gaussian(&mut self, mean: f32, std: f32) -> f32 {
        let u1 = self.uniform01().max(f64::MIN_POSITIVE);
        let u2 = self.uniform01();
        let z = (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos();
        (mean as f64 + std as f64 * z) as f32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_is_reproducible_and_in_range() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let xs: Vec<f32> = (0..100).map(|_| a.uniform(-1.0, 2.0)).collect();
        let ys: Vec<f32> = (0..100).map(|_| b.uniform(-1.0, 2.0)).collect();
        assert_eq!(xs, ys);
        assert!(xs.iter().all(|&x| (-1.0..=2.0).contains(&x)));
        let ints: Vec<i64> = (0..1000).map(|_| a.uniform_int(3, 5)).collect();
        assert!(ints.iter().all(|&x| (3..=5).contains(&x)));
        assert!(ints.contains(&3) && ints.contains(&5));
        let g: Vec<f32> = (0..20000).map(|_| a.gaussian(1.0, 2.0)).collect();
        let mean = g.iter().sum::<f32>() / g.len() as f32;
        assert!((mean - 1.0).abs() < 0.1, "{mean}");
    }
}
