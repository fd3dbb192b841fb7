//! Compressed file extents: zlib, LZO and zstd as btrfs stores them.
//!
//! Format facts (from the btrfs documentation and checked against images the
//! kernel wrote, see `tests/compression_kernel.rs`):
//!
//! - The compression type is a byte in the file extent item: 0 none, 1 zlib,
//!   2 LZO, 3 zstd.
//! - A compressed extent holds at most 128 KiB of uncompressed data
//!   ([`MAX_UNCOMPRESSED`]) and its compressed bytes are at most 128 KiB too.
//!   A regular extent's `ram_bytes` is rounded up to the sector size; the
//!   stream may decompress to fewer bytes (the file's end was inside the last
//!   sector), and the rest reads as zeros.
//! - zlib: one zlib stream (2-byte header, deflate data, adler32). The kernel
//!   skips the header and does not check the adler32, so neither do we.
//! - zstd: one zstd frame whose window is at most 128 KiB (window log 17).
//! - LZO: a 4-byte little-endian total length (header included), then
//!   segments: a 4-byte little-endian length and that many bytes of LZO1X data
//!   that decompress to one sector of the input (the last may be shorter). A
//!   segment header never straddles a sector boundary of the compressed
//!   stream: when fewer than 4 bytes are left before the boundary, they are
//!   zero padding. The writer pads after every segment, so the total length
//!   may end at a boundary.
//! - Inline extents hold the same streams, right after the 21-byte header of
//!   the file extent item.
//!
//! Decompression never allocates more than the output (at most 128 KiB) and
//! a few fixed-size work buffers, and never panics on damaged input: every
//! inconsistency is an [`Error::Corrupt`] that says what is wrong.

use std::fmt;

use zstd::stream::raw::{DParameter, InBuffer, Operation, OutBuffer};

use crate::{Error, Result};

/// The most uncompressed bytes one compressed extent holds (128 KiB).
pub const MAX_UNCOMPRESSED: usize = 128 * 1024;

/// The most compressed bytes one compressed extent holds (128 KiB).
pub const MAX_COMPRESSED: usize = 128 * 1024;

/// The most bytes one uncompressed extent holds (128 MiB).
pub const MAX_EXTENT: usize = 128 * 1024 * 1024;

/// The zlib level the kernel uses when none is given.
pub const ZLIB_DEFAULT_LEVEL: i32 = 3;

/// The zstd level the kernel uses when none is given.
pub const ZSTD_DEFAULT_LEVEL: i32 = 3;

/// The largest zstd window the kernel decompresses: 2^17 bytes = 128 KiB.
const ZSTD_MAX_WINDOW_LOG: u32 = 17;

/// zstd's frame magic number, as it appears on disk.
const ZSTD_MAGIC: [u8; 4] = [0x28, 0xb5, 0x2f, 0xfd];

/// Size of each LZO length field (the total and each segment's).
const LZO_LEN: usize = 4;

/// The compression of a file extent, as stored in the file extent item.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Compression {
    /// Not compressed (0).
    #[default]
    None,
    /// zlib (1).
    Zlib,
    /// LZO1X in btrfs's per-sector framing (2).
    Lzo,
    /// zstd (3).
    Zstd,
}

impl Compression {
    /// Decode the on-disk compression byte.
    pub fn from_disk(value: u8) -> Result<Self> {
        match value {
            0 => Ok(Compression::None),
            1 => Ok(Compression::Zlib),
            2 => Ok(Compression::Lzo),
            3 => Ok(Compression::Zstd),
            other => Err(Error::Unsupported(format!(
                "file extent compression type {other} (known: 0 none, 1 zlib, 2 lzo, 3 zstd)"
            ))),
        }
    }

    /// The on-disk compression byte.
    pub fn to_disk(self) -> u8 {
        match self {
            Compression::None => 0,
            Compression::Zlib => 1,
            Compression::Lzo => 2,
            Compression::Zstd => 3,
        }
    }

    /// The name btrfs tools and mount options use: `none`, `zlib`, `lzo`,
    /// `zstd`.
    pub fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Zlib => "zlib",
            Compression::Lzo => "lzo",
            Compression::Zstd => "zstd",
        }
    }
}

impl fmt::Display for Compression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Decompress one extent's stream into exactly `out_len` bytes.
///
/// `input` is the extent's compressed bytes: the `disk_num_bytes` read at
/// `disk_bytenr` for a regular extent (the stream and its zero padding to the
/// sector), or the data after the 21-byte header for an inline extent.
/// `out_len` is the extent's `ram_bytes`. A stream that ends early leaves the
/// rest zero-filled, one that has more is cut at `out_len`. `sectorsize` is
/// the filesystem's; LZO's framing depends on it.
///
/// [`Compression::None`] copies `input` (for callers that treat every extent
/// alike), up to [`MAX_EXTENT`] bytes.
///
/// Errors: [`Error::Corrupt`] if the stream is damaged or `out_len` is over
/// [`MAX_UNCOMPRESSED`]; [`Error::Invalid`] if `sectorsize` is not a power of
/// two from 512 to 65536.
pub fn decompress(
    kind: Compression,
    input: &[u8],
    out_len: usize,
    sectorsize: u32,
) -> Result<Vec<u8>> {
    let ss = check_sectorsize(sectorsize)?;
    let max = match kind {
        Compression::None => MAX_EXTENT,
        _ => MAX_UNCOMPRESSED,
    };
    if out_len > max {
        return Err(Error::corrupt(format!(
            "{kind} extent claims {out_len} bytes uncompressed, more than the {max} bytes \
             btrfs allows in {} extent",
            if kind == Compression::None {
                "an"
            } else {
                "a compressed"
            }
        )));
    }
    let mut out = vec![0u8; out_len];
    if out_len == 0 {
        return Ok(out);
    }
    let produced = match kind {
        Compression::None => {
            let n = input.len().min(out_len);
            out[..n].copy_from_slice(&input[..n]);
            n
        }
        Compression::Zlib => zlib_decompress(input, &mut out)?,
        Compression::Zstd => zstd_decompress(input, &mut out)?,
        Compression::Lzo => lzo_decompress(input, &mut out, ss)?,
    };
    // A short stream reads as zeros. The decoders may also have used the
    // space past what they produced as scratch (zstd does), so clear it.
    out[produced.min(out_len)..].fill(0);
    Ok(out)
}

/// Compress `input` (one extent's data, at most 128 KiB, starting at a
/// sector-aligned file offset) for a regular extent.
///
/// Returns `None` when compression does not free at least one sector: the
/// compressed size rounded up to `sectorsize`, plus one sector, must not
/// exceed the input size rounded up to `sectorsize` (the kernel's rule; it
/// then writes the data uncompressed). Also `None` for
/// [`Compression::None`] and for empty input. The stream returned is not
/// padded; the caller pads it with zeros to the sector when writing it.
///
/// `level`: zlib 1..=9 (default 3), zstd -15..=15 (default 3); `Some(0)`
/// means the default; LZO has no levels and ignores it.
pub fn compress(
    kind: Compression,
    level: Option<i32>,
    input: &[u8],
    sectorsize: u32,
) -> Result<Option<Vec<u8>>> {
    let ss = check_sectorsize(sectorsize)?;
    check_input_len(input)?;
    if kind == Compression::None || input.is_empty() {
        return Ok(None);
    }
    let rounded_in = input.len().div_ceil(ss) * ss;
    // round_up(out) + ss <= rounded_in  <=>  out <= rounded_in - ss, as
    // rounded_in - ss is a multiple of ss.
    let Some(limit) = rounded_in.checked_sub(ss).filter(|&l| l > 0) else {
        return Ok(None);
    };
    encode(kind, level, input, ss, limit)
}

/// Compress `input` into a stream of `kind` without the size rule of
/// [`compress`]: for inline extents, whose rule is the caller's (the
/// compressed data must fit the inline limits), and for tests.
///
/// Returns `None` only if the stream would be longer than
/// [`MAX_COMPRESSED`], which no extent may hold.
///
/// Errors: [`Error::Invalid`] for [`Compression::None`], input over
/// [`MAX_UNCOMPRESSED`], a bad level or sector size.
pub fn compress_stream(
    kind: Compression,
    level: Option<i32>,
    input: &[u8],
    sectorsize: u32,
) -> Result<Option<Vec<u8>>> {
    let ss = check_sectorsize(sectorsize)?;
    check_input_len(input)?;
    if kind == Compression::None {
        return Err(Error::Invalid(
            "compress_stream: compression type none has no stream".into(),
        ));
    }
    encode(kind, level, input, ss, MAX_COMPRESSED)
}

fn check_sectorsize(sectorsize: u32) -> Result<usize> {
    if !sectorsize.is_power_of_two() || !(512..=65536).contains(&sectorsize) {
        return Err(Error::Invalid(format!(
            "sector size {sectorsize} is not a power of two from 512 to 65536"
        )));
    }
    Ok(sectorsize as usize)
}

fn check_input_len(input: &[u8]) -> Result<()> {
    if input.len() > MAX_UNCOMPRESSED {
        return Err(Error::Invalid(format!(
            "cannot compress {} bytes into one extent: the limit is {MAX_UNCOMPRESSED}",
            input.len()
        )));
    }
    Ok(())
}

/// Compress; `None` if the output would be longer than `limit` bytes.
fn encode(
    kind: Compression,
    level: Option<i32>,
    input: &[u8],
    ss: usize,
    limit: usize,
) -> Result<Option<Vec<u8>>> {
    match kind {
        Compression::None => Ok(None),
        Compression::Zlib => zlib_compress(zlib_level(level)?, input, limit),
        Compression::Zstd => zstd_compress(zstd_level(level)?, input, limit),
        Compression::Lzo => Ok(lzo_compress(input, ss, limit)),
    }
}

fn zlib_level(level: Option<i32>) -> Result<u32> {
    match level {
        None | Some(0) => Ok(ZLIB_DEFAULT_LEVEL as u32),
        Some(l @ 1..=9) => Ok(l as u32),
        Some(l) => Err(Error::Invalid(format!(
            "zlib compression level {l}: btrfs accepts 1 to 9"
        ))),
    }
}

fn zstd_level(level: Option<i32>) -> Result<i32> {
    match level {
        None | Some(0) => Ok(ZSTD_DEFAULT_LEVEL),
        Some(l @ -15..=15) => Ok(l),
        Some(l) => Err(Error::Invalid(format!(
            "zstd compression level {l}: btrfs accepts -15 to 15"
        ))),
    }
}

// ---------------------------------------------------------------- zlib

/// Returns the number of bytes produced.
fn zlib_decompress(input: &[u8], out: &mut [u8]) -> Result<usize> {
    let [cmf, flg, ..] = *input else {
        return Err(Error::corrupt(format!(
            "zlib stream of {} bytes is too short for its 2-byte header",
            input.len()
        )));
    };
    if cmf & 0x0f != 8 {
        return Err(Error::corrupt(format!(
            "zlib header {cmf:02x} {flg:02x}: compression method {} is not deflate (8)",
            cmf & 0x0f
        )));
    }
    if (u16::from(cmf) << 8 | u16::from(flg)) % 31 != 0 {
        return Err(Error::corrupt(format!(
            "zlib header {cmf:02x} {flg:02x}: check bits are wrong"
        )));
    }
    if cmf >> 4 > 7 {
        return Err(Error::corrupt(format!(
            "zlib header {cmf:02x} {flg:02x}: window of 2^{} bytes is over the 32 KiB maximum",
            (cmf >> 4) + 8
        )));
    }
    if flg & 0x20 != 0 {
        return Err(Error::corrupt(format!(
            "zlib header {cmf:02x} {flg:02x}: asks for a preset dictionary, which btrfs never uses"
        )));
    }
    // Raw deflate after the header, as the kernel reads it: the adler32
    // trailer is not checked (the data checksums cover the stream).
    let data = &input[2..];
    let mut inflater = flate2::Decompress::new(false);
    let (mut inp, mut outp) = (0usize, 0usize);
    loop {
        let status = inflater
            .decompress(
                &data[inp..],
                &mut out[outp..],
                flate2::FlushDecompress::None,
            )
            .map_err(|e| {
                Error::corrupt(format!(
                    "zlib stream damaged after {} of {} compressed bytes: {e}",
                    2 + inflater.total_in(),
                    input.len()
                ))
            })?;
        let (new_in, new_out) = (inflater.total_in() as usize, inflater.total_out() as usize);
        let progress = new_in != inp || new_out != outp;
        (inp, outp) = (new_in.min(data.len()), new_out.min(out.len()));
        if status == flate2::Status::StreamEnd || outp == out.len() {
            return Ok(outp);
        }
        if !progress {
            return Err(Error::corrupt(format!(
                "zlib stream is truncated: its {} bytes end before the end-of-stream marker, \
                 after {outp} of {} uncompressed bytes",
                input.len(),
                out.len()
            )));
        }
    }
}

fn zlib_compress(level: u32, input: &[u8], limit: usize) -> Result<Option<Vec<u8>>> {
    let mut deflater = flate2::Compress::new(flate2::Compression::new(level), true);
    let bound = input.len() + input.len() / 8 + 64;
    let mut out = Vec::with_capacity(bound.min(limit.saturating_add(1)));
    loop {
        let consumed = deflater.total_in() as usize;
        let status = deflater
            .compress_vec(
                &input[consumed.min(input.len())..],
                &mut out,
                flate2::FlushCompress::Finish,
            )
            .map_err(|e| Error::Invalid(format!("zlib compression failed: {e}")))?;
        if out.len() > limit {
            return Ok(None);
        }
        if status == flate2::Status::StreamEnd {
            return Ok(Some(out));
        }
        out.reserve(4096);
    }
}

// ---------------------------------------------------------------- zstd

/// Returns the number of bytes produced.
fn zstd_decompress(input: &[u8], out: &mut [u8]) -> Result<usize> {
    if input.len() < ZSTD_MAGIC.len() || input[..4] != ZSTD_MAGIC {
        let shown = &input[..input.len().min(4)];
        return Err(Error::corrupt(format!(
            "zstd stream does not start with a zstd frame (magic 28 b5 2f fd), it starts {shown:02x?}"
        )));
    }
    let mut decoder = zstd::stream::raw::Decoder::new()
        .map_err(|e| Error::Invalid(format!("zstd decoder: {e}")))?;
    // The kernel decompresses windows of at most 128 KiB; refusing larger
    // ones also bounds our memory on damaged frame headers.
    decoder
        .set_parameter(DParameter::WindowLogMax(ZSTD_MAX_WINDOW_LOG))
        .map_err(|e| Error::Invalid(format!("zstd decoder: {e}")))?;
    let out_len = out.len();
    let mut src = InBuffer::around(input);
    let mut dst = OutBuffer::around(out);
    loop {
        let before = (src.pos(), dst.pos());
        let hint = decoder.run(&mut src, &mut dst).map_err(|e| {
            Error::corrupt(format!(
                "zstd frame damaged after {} of {} compressed bytes: {e}",
                src.pos(),
                input.len()
            ))
        })?;
        if hint == 0 || dst.pos() >= out_len {
            // The frame is complete (anything after it is padding), or we
            // have every byte the extent holds.
            return Ok(dst.pos().min(out_len));
        }
        if (src.pos(), dst.pos()) == before {
            return Err(Error::corrupt(format!(
                "zstd frame is truncated: its {} bytes end before the frame does, \
                 after {} of {out_len} uncompressed bytes",
                input.len(),
                dst.pos()
            )));
        }
    }
}

fn zstd_compress(level: i32, input: &[u8], limit: usize) -> Result<Option<Vec<u8>>> {
    let fail = |e: std::io::Error| Error::Invalid(format!("zstd compression failed: {e}"));
    let mut compressor = zstd::bulk::Compressor::new(level).map_err(fail)?;
    compressor
        .set_parameter(zstd::zstd_safe::CParameter::WindowLog(ZSTD_MAX_WINDOW_LOG))
        .map_err(fail)?;
    let out = compressor.compress(input).map_err(fail)?;
    Ok((out.len() <= limit).then_some(out))
}

// ---------------------------------------------------------------- LZO

/// The most bytes LZO1X turns `n` input bytes into.
fn lzo_worst(n: usize) -> usize {
    n + n / 16 + 64 + 3
}

fn read_le32(bytes: &[u8], at: usize) -> Option<usize> {
    let b = bytes.get(at..at.checked_add(4)?)?;
    Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]) as usize)
}

/// Returns the number of bytes produced.
fn lzo_decompress(input: &[u8], out: &mut [u8], ss: usize) -> Result<usize> {
    let Some(total) = read_le32(input, 0) else {
        return Err(Error::corrupt(format!(
            "lzo stream of {} bytes is too short for its 4-byte length header",
            input.len()
        )));
    };
    if total < LZO_LEN || total > input.len() || total > MAX_COMPRESSED {
        return Err(Error::corrupt(format!(
            "lzo length header says {total} bytes, but the extent holds {} compressed bytes \
             (the length must be 4 to {})",
            input.len(),
            input.len().min(MAX_COMPRESSED)
        )));
    }
    if total.div_ceil(ss) * ss < input.len() {
        return Err(Error::corrupt(format!(
            "lzo length header says {total} bytes, too few for an extent of {} compressed bytes \
             with {ss}-byte sectors",
            input.len()
        )));
    }
    let worst = lzo_worst(ss);
    let mut segment = vec![0u8; ss];
    let mut pos = LZO_LEN;
    let mut produced = 0usize;
    while pos < total && produced < out.len() {
        let left_in_sector = ss - pos % ss;
        if left_in_sector < LZO_LEN {
            // Zero padding: a segment header never straddles a sector.
            pos += left_in_sector;
            continue;
        }
        let header_at = pos;
        let seg_len = match read_le32(&input[..total], pos) {
            Some(len) => len,
            None => {
                return Err(Error::corrupt(format!(
                    "lzo segment header at offset {pos} runs past the stream's end at {total}"
                )));
            }
        };
        pos += LZO_LEN;
        if seg_len == 0 || seg_len > worst || seg_len > total - pos {
            return Err(Error::corrupt(format!(
                "lzo segment at offset {header_at} claims {seg_len} bytes; it must be 1 to \
                 {} (worst case for a {ss}-byte sector, and within the stream's {total} bytes)",
                worst.min(total - pos)
            )));
        }
        let n = lzokay::decompress::decompress(&input[pos..pos + seg_len], &mut segment).map_err(
            |e| {
                let why = match e {
                    lzokay::Error::OutputOverrun => {
                        format!("it decompresses to more than one {ss}-byte sector")
                    }
                    lzokay::Error::InputNotConsumed => {
                        "data follows its end-of-stream marker".to_string()
                    }
                    lzokay::Error::InputOverrun => "it is truncated".to_string(),
                    lzokay::Error::LookbehindOverrun => {
                        "a match refers to data before the segment's start".to_string()
                    }
                    other => format!("{other}"),
                };
                Error::corrupt(format!(
                    "lzo segment at offset {header_at} ({seg_len} bytes) is damaged: {why}"
                ))
            },
        )?;
        let take = n.min(out.len() - produced);
        out[produced..produced + take].copy_from_slice(&segment[..take]);
        produced += take;
        pos += seg_len;
    }
    Ok(produced)
}

/// LZO1X-1 per sector, in btrfs's framing; `None` if longer than `limit`.
fn lzo_compress(input: &[u8], ss: usize, limit: usize) -> Option<Vec<u8>> {
    let mut out = Vec::with_capacity(lzo_worst(input.len()).min(limit.saturating_add(1)));
    out.extend_from_slice(&[0u8; LZO_LEN]);
    for chunk in input.chunks(ss) {
        let seg = lzo1x::compress(chunk, lzo1x::CompressLevel::default());
        out.extend_from_slice(&(seg.len() as u32).to_le_bytes());
        out.extend_from_slice(&seg);
        let left_in_sector = ss - out.len() % ss;
        if left_in_sector < LZO_LEN {
            out.resize(out.len() + left_in_sector, 0);
        }
        if out.len() > limit {
            return None;
        }
    }
    let total = out.len() as u32;
    out[..LZO_LEN].copy_from_slice(&total.to_le_bytes());
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ALGS: [Compression; 3] = [Compression::Zlib, Compression::Lzo, Compression::Zstd];

    /// Fails unless `r` is a corruption error; `what` names the case.
    #[track_caller]
    fn assert_corrupt(r: Result<Vec<u8>>, what: &str) {
        assert!(
            matches!(r, Err(Error::Corrupt(_))),
            "{what}: {:?}",
            r.map(|v| v.len())
        );
    }

    /// A small deterministic generator for test data.
    struct Rng(u64);

    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn below(&mut self, n: usize) -> usize {
            (self.next() % n as u64) as usize
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next() as u8).collect()
        }
    }

    fn text(n: usize) -> Vec<u8> {
        let mut v = Vec::with_capacity(n + 64);
        let mut i = 0u64;
        while v.len() < n {
            v.extend_from_slice(
                format!("line {i}: the quick brown fox {} jumps\n", i * 7919 % 1013).as_bytes(),
            );
            i += 1;
        }
        v.truncate(n);
        v
    }

    fn mixed(n: usize, seed: u64) -> Vec<u8> {
        let mut rng = Rng(seed);
        let mut v = text(n);
        for (i, chunk) in v.chunks_mut(1000).enumerate() {
            if i % 2 == 1 {
                chunk.copy_from_slice(&rng.bytes(chunk.len()));
            }
        }
        v
    }

    fn same(a: impl AsRef<[u8]>, b: impl AsRef<[u8]>) -> bool {
        a.as_ref() == b.as_ref()
    }

    const SIZES: [usize; 19] = [
        0, 1, 2, 3, 17, 100, 511, 512, 3000, 4093, 4095, 4096, 4097, 8192, 12345, 65536, 100_000,
        131_071, 131_072,
    ];

    #[test]
    fn disk_values() {
        for v in 0..=3u8 {
            assert_eq!(Compression::from_disk(v).unwrap().to_disk(), v);
        }
        for v in 4..=255u8 {
            assert!(matches!(
                Compression::from_disk(v),
                Err(Error::Unsupported(_))
            ));
        }
        assert_eq!(Compression::Zstd.to_string(), "zstd");
    }

    #[test]
    fn compression_round_trips() {
        for kind in ALGS {
            for ss in [4096u32, 16384, 65536] {
                for &n in &SIZES {
                    for (what, data) in [
                        ("text", text(n)),
                        ("zeros", vec![0u8; n]),
                        ("mixed", mixed(n, 7)),
                        ("random", Rng(n as u64 + 1).bytes(n)),
                    ] {
                        match compress_stream(kind, None, &data, ss).unwrap() {
                            Some(stream) => {
                                let back = decompress(kind, &stream, n, ss).unwrap();
                                assert!(back == data, "{kind} {what} {n} bytes, sector {ss}");
                            }
                            None => assert!(what == "random" && n > 120_000, "{kind} {what} {n}"),
                        }

                        // The regular-extent rule.
                        let ssz = ss as usize;
                        match compress(kind, None, &data, ss).unwrap() {
                            Some(c) => {
                                assert!(c.len().div_ceil(ssz) * ssz + ssz <= n.div_ceil(ssz) * ssz);
                                // As read from disk: padded to the sector, ram_bytes rounded up.
                                let mut padded = c.clone();
                                padded.resize(c.len().div_ceil(ssz) * ssz, 0);
                                let ram = n.div_ceil(ssz) * ssz;
                                let back = decompress(kind, &padded, ram, ss).unwrap();
                                assert!(back[..n] == data[..], "{kind} {what} {n}");
                                assert!(back[n..].iter().all(|&b| b == 0));
                            }
                            None => assert!(
                                what == "random" || n <= 2 * ssz || (what == "mixed" && n <= 8192),
                                "{kind} {what} {n} bytes, sector {ss}: expected to compress"
                            ),
                        }
                        if what == "random" {
                            assert!(compress(kind, None, &data, ss).unwrap().is_none());
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn levels() {
        let data = text(50_000);
        for level in [-15, -1, 0, 1, 9, 15] {
            let c = compress(Compression::Zstd, Some(level), &data, 4096)
                .unwrap()
                .unwrap();
            assert!(same(
                decompress(Compression::Zstd, &c, data.len(), 4096).unwrap(),
                &data
            ));
        }
        for level in 0..=9 {
            let c = compress(Compression::Zlib, Some(level), &data, 4096)
                .unwrap()
                .unwrap();
            assert!(same(
                decompress(Compression::Zlib, &c, data.len(), 4096).unwrap(),
                &data
            ));
        }
        for (kind, level) in [
            (Compression::Zlib, 10),
            (Compression::Zlib, -1),
            (Compression::Zstd, 16),
            (Compression::Zstd, -16),
        ] {
            assert!(matches!(
                compress(kind, Some(level), &data, 4096),
                Err(Error::Invalid(_))
            ));
        }
        assert!(
            compress(Compression::Lzo, Some(42), &data, 4096)
                .unwrap()
                .is_some()
        );
    }

    #[test]
    fn short_and_long_output() {
        for kind in ALGS {
            let data = text(10_000);
            let c = compress_stream(kind, None, &data, 4096).unwrap().unwrap();
            let long = decompress(kind, &c, 12_288, 4096).unwrap();
            assert!(same(&long[..10_000], &data[..]), "{kind}");
            let nz: Vec<usize> = (10_000..long.len()).filter(|&i| long[i] != 0).collect();
            assert!(
                nz.is_empty(),
                "{kind}: nonzero at {:?} of {}",
                &nz[..nz.len().min(10)],
                nz.len()
            );
            let short = decompress(kind, &c, 5000, 4096).unwrap();
            assert!(same(&short[..], &data[..5000]));
            assert!(decompress(kind, &c, 0, 4096).unwrap().is_empty());
        }
    }

    #[test]
    fn none_and_bad_arguments() {
        assert_eq!(
            decompress(Compression::None, b"abc", 5, 4096).unwrap(),
            b"abc\0\0"
        );
        assert!(
            compress(Compression::None, None, &text(100_000), 4096)
                .unwrap()
                .is_none()
        );
        assert!(compress_stream(Compression::None, None, b"x", 4096).is_err());
        for ss in [0, 100, 4095, 1 << 17] {
            assert!(matches!(
                decompress(Compression::Lzo, b"", 1, ss),
                Err(Error::Invalid(_))
            ));
            assert!(matches!(
                compress(Compression::Lzo, None, b"x", ss),
                Err(Error::Invalid(_))
            ));
        }
        let big = vec![0u8; MAX_UNCOMPRESSED + 1];
        for kind in ALGS {
            assert!(matches!(
                compress(kind, None, &big, 4096),
                Err(Error::Invalid(_))
            ));
            assert!(compress(kind, None, &[], 4096).unwrap().is_none());
        }
    }

    #[test]
    fn huge_out_len_is_corrupt() {
        for kind in ALGS {
            let c = compress_stream(kind, None, &text(5000), 4096)
                .unwrap()
                .unwrap();
            for n in [MAX_UNCOMPRESSED + 1, 1 << 30, usize::MAX] {
                let e = decompress(kind, &c, n, 4096).unwrap_err();
                assert!(matches!(e, Error::Corrupt(_)), "{kind}: {e}");
            }
        }
    }

    #[test]
    fn zstd_window_over_128k_is_refused() {
        // Frame header without a content size, so the window descriptor
        // byte (exponent << 3) gives the window: 2^(10 + exponent). Then one
        // last raw block of one byte.
        let frame = |exponent: u8| {
            let mut f = ZSTD_MAGIC.to_vec();
            f.extend_from_slice(&[0x00, exponent << 3, 0x09, 0x00, 0x00, b'x']);
            f
        };
        let ok = decompress(Compression::Zstd, &frame(7), 2, 4096).unwrap();
        assert_eq!(ok, b"x\0");
        for exponent in [8, 17, 31] {
            let r = decompress(Compression::Zstd, &frame(exponent), 2, 4096);
            assert!(matches!(r, Err(Error::Corrupt(_))), "2^{}", exponent + 10);
        }
        // Not a zstd frame at all.
        let r = decompress(Compression::Zstd, b"\x00\x00\x00\x00abcd", 2, 4096);
        assert!(matches!(r, Err(Error::Corrupt(_))));
    }

    #[test]
    fn uncompressed_limit() {
        let r = decompress(Compression::None, b"abc", MAX_EXTENT + 1, 4096);
        assert!(matches!(r, Err(Error::Corrupt(_))));
        let big = decompress(Compression::None, b"abc", MAX_UNCOMPRESSED * 2, 4096).unwrap();
        assert_eq!(big.len(), MAX_UNCOMPRESSED * 2);
    }

    #[test]
    fn truncated_streams_are_corrupt() {
        for kind in ALGS {
            let data = text(100_000);
            let c = compress_stream(kind, None, &data, 4096).unwrap().unwrap();
            for cut in [
                0,
                1,
                2,
                3,
                4,
                5,
                9,
                c.len() / 3,
                c.len() / 2,
                c.len() * 9 / 10,
            ] {
                let r = decompress(kind, &c[..cut], data.len(), 4096);
                assert_corrupt(r, &format!("{kind} cut at {cut}"));
            }
        }
    }

    #[test]
    fn random_bytes_are_corrupt() {
        let mut rng = Rng(99);
        for kind in ALGS {
            // (Not 4 bytes: for LZO that is a valid stream with no segments.)
            for n in [0, 1, 3, 16, 100, 4096, 20_000] {
                let mut garbage = rng.bytes(n);
                if kind == Compression::Lzo && n >= 4 {
                    // Make the length header plausible so the segments are tried.
                    garbage[..4].copy_from_slice(&(n as u32).to_le_bytes());
                }
                let r = decompress(kind, &garbage, 4096, 4096);
                assert_corrupt(r, &format!("{kind} {n}"));
            }
        }
    }

    #[test]
    fn lzo_header_checks() {
        let data = text(20_000);
        let c = compress_stream(Compression::Lzo, None, &data, 4096)
            .unwrap()
            .unwrap();
        let total = c.len();
        let with_total = |t: u32| {
            let mut v = c.clone();
            v[..4].copy_from_slice(&t.to_le_bytes());
            v
        };
        let bad = |v: &[u8], what: &str| {
            assert_corrupt(decompress(Compression::Lzo, v, data.len(), 4096), what);
        };
        bad(&with_total(0), "total 0");
        bad(&with_total(3), "total 3");
        bad(&with_total(total as u32 + 1), "total past the input");
        bad(&with_total(u32::MAX), "huge total");
        // Far more input than the header covers.
        let mut long = c.clone();
        long.resize(total.div_ceil(4096) * 4096 + 4096, 0);
        bad(&long, "input longer than the total rounded up");
        // Padded to the sector, as read from disk, is fine.
        let mut padded = c.clone();
        padded.resize(total.div_ceil(4096) * 4096, 0);
        assert!(same(
            decompress(Compression::Lzo, &padded, data.len(), 4096).unwrap(),
            &data
        ));
        // Segment lengths: zero, over the worst case, past the end.
        for seg in [0u32, 5000, total as u32] {
            let mut v = c.clone();
            v[4..8].copy_from_slice(&seg.to_le_bytes());
            bad(&v, &format!("segment length {seg}"));
        }
        // A segment that decompresses to more than a sector.
        let two_sectors = lzo1x::compress(&text(8192), lzo1x::CompressLevel::default());
        let mut v = Vec::new();
        v.extend_from_slice(&((8 + two_sectors.len()) as u32).to_le_bytes());
        v.extend_from_slice(&(two_sectors.len() as u32).to_le_bytes());
        v.extend_from_slice(&two_sectors);
        bad(&v, "segment over a sector");
        // Data after a segment's end marker.
        let one = lzo1x::compress(&text(100), lzo1x::CompressLevel::default());
        let mut v = Vec::new();
        v.extend_from_slice(&((8 + one.len() + 1) as u32).to_le_bytes());
        v.extend_from_slice(&((one.len() + 1) as u32).to_le_bytes());
        v.extend_from_slice(&one);
        v.push(0);
        bad(&v, "trailing data in a segment");
    }

    /// Find input whose first segment ends 1..=3 bytes before a sector
    /// boundary, and check the writer pads and the reader skips the padding.
    #[test]
    fn lzo_segment_header_never_straddles_a_sector() {
        let ss = 4096usize;
        let mut rng = Rng(5);
        let noise = rng.bytes(ss);
        let mut found = [false; 4];
        // Zeros compress to almost nothing and LZO1X-1 stores the noise as
        // literals, so each zero more shortens the segment by about a byte.
        for zeros in 0..200 {
            let mut first = vec![0u8; zeros];
            first.extend_from_slice(&noise[..ss - zeros]);
            let seg = lzo1x::compress(&first, lzo1x::CompressLevel::default());
            let end = 2 * LZO_LEN + seg.len();
            if end > ss || ss - end >= LZO_LEN || found[ss - end] {
                continue;
            }
            found[ss - end] = true;
            let mut data = first.clone();
            data.extend_from_slice(&text(5000));
            let c = compress_stream(Compression::Lzo, None, &data, ss as u32)
                .unwrap()
                .unwrap();
            assert!(c[end..ss].iter().all(|&b| b == 0), "padding at {end}");
            let second = read_le32(&c, ss).unwrap();
            assert!(second > 0 && second < ss);
            assert!(same(
                decompress(Compression::Lzo, &c, data.len(), ss as u32).unwrap(),
                &data
            ));
            // The padded stream can also end right there.
            let c = compress_stream(Compression::Lzo, None, &first, ss as u32)
                .unwrap()
                .unwrap();
            assert_eq!(c.len(), ss);
            assert_eq!(read_le32(&c, 0), Some(ss));
            assert!(same(
                decompress(Compression::Lzo, &c, ss, ss as u32).unwrap(),
                &first
            ));
        }
        assert!(
            found[1..].iter().any(|&f| f),
            "no input hit the padding case"
        );
    }

    /// Damaged streams: random, bit-flipped and truncated variants of valid
    /// ones. Each must give an error or exactly `out_len` bytes, never a panic.
    #[test]
    fn fuzz_no_panics() {
        let mut rng = Rng(0x5eed);
        let samples: Vec<Vec<u8>> = vec![
            text(3000),
            text(100_000),
            mixed(65_536, 3),
            vec![7u8; 131_072],
        ];
        for kind in ALGS {
            let streams: Vec<(usize, Vec<u8>)> = samples
                .iter()
                .map(|d| {
                    (
                        d.len(),
                        compress_stream(kind, None, d, 4096).unwrap().unwrap(),
                    )
                })
                .collect();
            for round in 0..1500 {
                let (n, base) = &streams[round % streams.len()];
                let mut v = base.clone();
                match rng.below(4) {
                    0 => {
                        for _ in 0..1 + rng.below(8) {
                            let i = rng.below(v.len());
                            v[i] ^= 1 << rng.below(8);
                        }
                    }
                    1 => v.truncate(rng.below(v.len())),
                    2 => {
                        let i = rng.below(v.len());
                        let len = rng.below(64).min(v.len() - i);
                        let junk = rng.bytes(len);
                        v[i..i + len].copy_from_slice(&junk);
                    }
                    _ => {
                        let len = rng.below(9000);
                        v = rng.bytes(len);
                    }
                }
                let out_len = match rng.below(3) {
                    0 => *n,
                    1 => rng.below(MAX_UNCOMPRESSED + 1),
                    _ => n.div_ceil(4096) * 4096,
                };
                let r = std::panic::catch_unwind(|| decompress(kind, &v, out_len, 4096));
                match r {
                    Err(_) => panic!("{kind}: decompress panicked (round {round})"),
                    Ok(Ok(out)) => assert_eq!(out.len(), out_len),
                    Ok(Err(e)) => assert!(matches!(e, Error::Corrupt(_)), "{kind}: {e}"),
                }
            }
        }
    }
}
