//! Length-prefixed binary frames over TCP, shared by the rendezvous, the control plane and the
//! TCP communicator.
//!
//! A frame is `u32` payload length (little endian) followed by the payload; the payload starts
//! with a one-byte tag that says what it is. Every integer is little endian; `usize` travels as
//! `u64`; strings as `u64` byte length + UTF-8; vectors as `u64` element count + elements.
//! Frames larger than [`MAX_FRAME`] are refused (a stray connection or a corrupted stream, not a
//! payload of this protocol).

use std::io::{Read, Write};
use std::net::TcpStream;

/// Largest payload accepted, bytes (1 GiB: the biggest collective of a CPU test model is a few
/// MB; a larger length means the stream is not speaking this protocol).
pub const MAX_FRAME: usize = 1 << 30;

/// A payload being built.
#[derive(Debug, Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    /// A payload starting with `tag`.
    #[must_use]
    pub fn tag(tag: u8) -> Self {
        Self(vec![tag])
    }
    /// Append a byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// Append a `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Append a `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Append a `usize` (as `u64`).
    pub fn usize(&mut self, v: usize) -> &mut Self {
        self.u64(v as u64)
    }
    /// Append an `f32` (its bits).
    pub fn f32(&mut self, v: f32) -> &mut Self {
        self.u32(v.to_bits())
    }
    /// Append a string.
    pub fn str(&mut self, s: &str) -> &mut Self {
        self.usize(s.len());
        self.0.extend_from_slice(s.as_bytes());
        self
    }
    /// Append raw bytes with their length.
    pub fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.usize(b.len());
        self.0.extend_from_slice(b);
        self
    }
    /// Append `i32`s with their count.
    pub fn i32s(&mut self, v: &[i32]) -> &mut Self {
        self.usize(v.len());
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
        self
    }
    /// Append `i64`s with their count.
    pub fn i64s(&mut self, v: &[i64]) -> &mut Self {
        self.usize(v.len());
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
        self
    }
    /// Append `u32`s with their count.
    pub fn u32s(&mut self, v: &[u32]) -> &mut Self {
        self.usize(v.len());
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
        self
    }
    /// Append `u64`s (from `usize`) with their count.
    pub fn usizes(&mut self, v: &[usize]) -> &mut Self {
        self.usize(v.len());
        for &x in v {
            self.u64(x as u64);
        }
        self
    }
    /// Append `f32`s (their bits) with their count.
    pub fn f32s(&mut self, v: &[f32]) -> &mut Self {
        self.usize(v.len());
        self.0.reserve(4 * v.len());
        for x in v {
            self.0.extend_from_slice(&x.to_le_bytes());
        }
        self
    }
}

/// A payload being read; every read fails with a message naming what was being read when the
/// payload is too short or malformed.
#[derive(Debug)]
pub struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    /// Read `buf` from its start.
    #[must_use]
    pub fn new(buf: &'a [u8]) -> Self {
        Self { buf, pos: 0 }
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len()).ok_or_else(|| {
            format!("truncated frame reading {what} ({n} bytes at offset {})", self.pos)
        })?;
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }
    /// A byte.
    ///
    /// # Errors
    /// A message when the payload ends.
    pub fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }
    /// A `u32`.
    ///
    /// # Errors
    /// A message when the payload ends.
    pub fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }
    /// A `u64`.
    ///
    /// # Errors
    /// A message when the payload ends.
    pub fn u64(&mut self, what: &str) -> Result<u64, String> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_le_bytes(a))
    }
    /// A `usize` (sent as `u64`).
    ///
    /// # Errors
    /// A message when the payload ends or the value does not fit.
    pub fn usize(&mut self, what: &str) -> Result<usize, String> {
        let v = self.u64(what)?;
        usize::try_from(v).map_err(|_| format!("{what} = {v} does not fit usize"))
    }
    /// An `f32`.
    ///
    /// # Errors
    /// A message when the payload ends.
    pub fn f32(&mut self, what: &str) -> Result<f32, String> {
        Ok(f32::from_bits(self.u32(what)?))
    }
    /// A count of `elem`-byte elements that must fit in the rest of the payload.
    fn count(&mut self, elem: usize, what: &str) -> Result<usize, String> {
        let n = self.usize(what)?;
        let left = self.buf.len() - self.pos;
        if n.checked_mul(elem).is_none_or(|b| b > left) {
            return Err(format!("{what}: {n} elements do not fit the {left} bytes left"));
        }
        Ok(n)
    }
    /// A string.
    ///
    /// # Errors
    /// A message when the payload ends or the bytes are not UTF-8.
    pub fn str(&mut self, what: &str) -> Result<String, String> {
        let n = self.count(1, what)?;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).map_err(|e| format!("{what}: not UTF-8 ({e})"))
    }
    /// Raw bytes.
    ///
    /// # Errors
    /// A message when the payload ends.
    pub fn bytes(&mut self, what: &str) -> Result<Vec<u8>, String> {
        let n = self.count(1, what)?;
        Ok(self.take(n, what)?.to_vec())
    }
    /// `i32`s.
    ///
    /// # Errors
    /// A message when the payload ends.
    pub fn i32s(&mut self, what: &str) -> Result<Vec<i32>, String> {
        let n = self.count(4, what)?;
        let b = self.take(4 * n, what)?;
        Ok(b.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
    /// `i64`s.
    ///
    /// # Errors
    /// A message when the payload ends.
    pub fn i64s(&mut self, what: &str) -> Result<Vec<i64>, String> {
        let n = self.count(8, what)?;
        let b = self.take(8 * n, what)?;
        Ok(b.chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                i64::from_le_bytes(a)
            })
            .collect())
    }
    /// `u32`s.
    ///
    /// # Errors
    /// A message when the payload ends.
    pub fn u32s(&mut self, what: &str) -> Result<Vec<u32>, String> {
        let n = self.count(4, what)?;
        let b = self.take(4 * n, what)?;
        Ok(b.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
    /// `usize`s (sent as `u64`).
    ///
    /// # Errors
    /// A message when the payload ends or a value does not fit.
    pub fn usizes(&mut self, what: &str) -> Result<Vec<usize>, String> {
        let n = self.count(8, what)?;
        (0..n).map(|_| self.usize(what)).collect()
    }
    /// `f32`s.
    ///
    /// # Errors
    /// A message when the payload ends.
    pub fn f32s(&mut self, what: &str) -> Result<Vec<f32>, String> {
        let n = self.count(4, what)?;
        let b = self.take(4 * n, what)?;
        Ok(b.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
    /// Whether every byte was read.
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.pos == self.buf.len()
    }
}

/// Write one frame (length prefix + `payload`) in a single write.
///
/// # Errors
/// The stream's I/O error; a payload over [`MAX_FRAME`].
pub fn write_frame(mut s: &TcpStream, payload: &[u8]) -> std::io::Result<()> {
    if payload.len() > MAX_FRAME {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            format!("frame of {} bytes exceeds {MAX_FRAME}", payload.len()),
        ));
    }
    let mut buf = Vec::with_capacity(4 + payload.len());
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(payload);
    s.write_all(&buf)?;
    s.flush()
}

/// Read one frame's payload. A clean end of stream before the length is
/// [`std::io::ErrorKind::UnexpectedEof`] like any other short read.
///
/// # Errors
/// The stream's I/O error; a length over [`MAX_FRAME`] ([`std::io::ErrorKind::InvalidData`]).
pub fn read_frame(mut s: &TcpStream) -> std::io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    s.read_exact(&mut len)?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_FRAME || n == 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("frame length {n} is not a frame of this protocol"),
        ));
    }
    let mut buf = vec![0u8; n];
    s.read_exact(&mut buf)?;
    Ok(buf)
}

/// An I/O error of a frame read or write as text: the end of the stream reads "connection
/// closed" (std's "failed to fill whole buffer" says nothing to a user).
#[must_use]
pub fn io_text(e: &std::io::Error) -> String {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => "connection closed".into(),
        _ => e.to_string(),
    }
}

/// FNV-1a 64-bit hash: stable across processes, builds and machines (the handshake compares
/// hashes computed by different processes).
#[must_use]
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_every_type() {
        let mut e = Enc::tag(7);
        e.u8(3).u32(0xdead_beef).u64(u64::MAX).usize(42).f32(-0.0).str("héllo");
        e.bytes(&[1, 2, 3]).i32s(&[-1, 2]).i64s(&[i64::MIN]).u32s(&[9]).usizes(&[5, 6]);
        e.f32s(&[1.5, f32::NAN]);
        let mut d = Dec::new(&e.0);
        assert_eq!(d.u8("tag").unwrap(), 7);
        assert_eq!(d.u8("a").unwrap(), 3);
        assert_eq!(d.u32("b").unwrap(), 0xdead_beef);
        assert_eq!(d.u64("c").unwrap(), u64::MAX);
        assert_eq!(d.usize("d").unwrap(), 42);
        assert_eq!(d.f32("e").unwrap().to_bits(), (-0.0f32).to_bits());
        assert_eq!(d.str("f").unwrap(), "héllo");
        assert_eq!(d.bytes("g").unwrap(), vec![1, 2, 3]);
        assert_eq!(d.i32s("h").unwrap(), vec![-1, 2]);
        assert_eq!(d.i64s("i").unwrap(), vec![i64::MIN]);
        assert_eq!(d.u32s("j").unwrap(), vec![9]);
        assert_eq!(d.usizes("k").unwrap(), vec![5, 6]);
        let f = d.f32s("l").unwrap();
        assert_eq!(f[0].to_bits(), 1.5f32.to_bits());
        assert!(f[1].is_nan());
        assert!(d.is_done());
        let e = d.u8("past the end").unwrap_err();
        assert!(e.contains("past the end"), "{e}");
    }

    #[test]
    fn huge_counts_are_refused_not_allocated() {
        let mut e = Enc::default();
        e.u64(u64::MAX / 2);
        let err = Dec::new(&e.0).f32s("data").unwrap_err();
        assert!(err.contains("do not fit"), "{err}");
    }
}
