//! Guessing, from a sample, that data will not compress: the `compress`
//! mount option then writes it plain without spending CPU on a
//! compressor that would fail anyway, as the kernel does. `compress-force`
//! skips the guess and tries every extent.
//!
//! The guess looks at 16 bytes of every 256 (about 6 % of the data):
//! - a sample whose halves are equal comes from repeating data, which
//!   compresses whatever its bytes look like;
//! - few distinct byte values (text, sparse tables) compress;
//! - otherwise the sample's byte entropy decides: data close to 8 bits
//!   of information per byte (random, encrypted, already compressed)
//!   does not compress.

/// Bytes taken from each stretch of [`SAMPLE_EVERY`].
const SAMPLE_BYTES: usize = 16;
/// One sample is taken from each stretch of this many bytes.
const SAMPLE_EVERY: usize = 256;
/// Data shorter than this is always tried: sampling it says little and
/// compressing it costs little.
const MIN_GUESS: usize = 8 << 10;
/// At most this many distinct byte values: compressible.
const FEW_SYMBOLS: usize = 64;
/// Byte entropy of the sample, in millibits per byte, at or above which
/// the data is taken to be incompressible. A uniform random sample of
/// 8 KiB measures about 7,980; English text about 4,500, machine code
/// about 6,000 to 6,500.
const INCOMPRESSIBLE_MILLIBITS: u32 = 7_600;

/// Whether `data` looks incompressible (see the module's documentation).
/// False means "worth trying", not a promise that it compresses.
pub fn looks_incompressible(data: &[u8]) -> bool {
    if data.len() < MIN_GUESS {
        return false;
    }
    let mut sample = Vec::with_capacity(data.len() / SAMPLE_EVERY * SAMPLE_BYTES);
    for stretch in data.chunks_exact(SAMPLE_EVERY) {
        sample.extend_from_slice(&stretch[..SAMPLE_BYTES]);
    }
    let (a, b) = sample.split_at(sample.len() / 2);
    if a == &b[..a.len()] {
        return false;
    }
    let mut counts = [0u32; 256];
    for &byte in &sample {
        counts[byte as usize] += 1;
    }
    if counts.iter().filter(|&&c| c > 0).count() <= FEW_SYMBOLS {
        return false;
    }
    entropy_millibits(&counts, sample.len()) >= INCOMPRESSIBLE_MILLIBITS
}

/// Shannon entropy of a byte histogram over `n` bytes, in thousandths of
/// a bit per byte.
fn entropy_millibits(counts: &[u32; 256], n: usize) -> u32 {
    let n = n as f64;
    let bits: f64 = counts
        .iter()
        .filter(|&&c| c > 0)
        .map(|&c| {
            let p = c as f64 / n;
            -p * p.log2()
        })
        .sum();
    (bits * 1000.0) as u32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn noise(seed: u64, n: usize) -> Vec<u8> {
        testkit::xorshift_bytes(seed, n)
    }

    #[test]
    fn random_bytes_look_incompressible() {
        for seed in 1..20 {
            assert!(looks_incompressible(&noise(seed, 128 << 10)), "seed {seed}");
        }
    }

    #[test]
    fn text_zeros_and_small_inputs_are_worth_trying() {
        let text: Vec<u8> = (0..20_000u32)
            .flat_map(|i| format!("line {i} of some text\n").into_bytes())
            .take(128 << 10)
            .collect();
        assert!(!looks_incompressible(&text));
        assert!(!looks_incompressible(&vec![0u8; 128 << 10]));
        assert!(!looks_incompressible(&noise(3, 4 << 10)));
    }

    #[test]
    fn repeated_random_data_is_worth_trying() {
        // 32 KiB of noise four times over: zstd halves it and more.
        let block = noise(5, 32 << 10);
        let data: Vec<u8> = block.iter().copied().cycle().take(128 << 10).collect();
        assert!(!looks_incompressible(&data));
        let z = crate::data::compression::compress(
            crate::data::compression::Compression::Zstd,
            None,
            &data,
            4096,
        )
        .unwrap()
        .expect("repeated data compresses");
        assert!(z.len() < data.len() / 2);
    }

    #[test]
    fn random_bytes_from_a_small_alphabet_are_worth_trying() {
        // Random hex digits: 4 bits of information per byte.
        let hex: Vec<u8> = noise(9, 128 << 10)
            .into_iter()
            .map(|b| b"0123456789abcdef"[(b & 15) as usize])
            .collect();
        assert!(!looks_incompressible(&hex));
        // Base64-like: 64 symbols, 6 bits per byte, still compresses.
        let b64: Vec<u8> = noise(11, 128 << 10)
            .into_iter()
            .map(|b| b'0' + (b & 63))
            .collect();
        assert!(!looks_incompressible(&b64));
    }
}
