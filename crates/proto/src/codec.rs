//! Field encodings shared by every message: fixed little-endian integers, LEB128 varints
//! (minimal), length-prefixed byte strings, tagged ids.

use ferry_format::{Id, TAGGED_ID_BYTES};

use crate::ProtoError;

#[derive(Default)]
pub(crate) struct Writer(pub Vec<u8>);

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.0.push(v);
    }
    pub fn u16(&mut self, v: u16) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u32(&mut self, v: u32) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn i64(&mut self, v: i64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    pub fn varint(&mut self, mut v: u64) {
        while v >= 0x80 {
            self.0.push(v as u8 | 0x80);
            v >>= 7;
        }
        self.0.push(v as u8);
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    pub fn id(&mut self, id: &Id) {
        self.0.extend_from_slice(&id.to_bytes());
    }
    pub fn opt_id(&mut self, id: Option<&Id>) {
        match id {
            None => self.u8(0),
            Some(id) => {
                self.u8(1);
                self.id(id);
            }
        }
    }
}

pub(crate) struct Reader<'a> {
    buf: &'a [u8],
    what: &'static str,
}

impl<'a> Reader<'a> {
    pub fn new(buf: &'a [u8], what: &'static str) -> Self {
        Reader { buf, what }
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        if self.buf.len() < n {
            return Err(ProtoError::Truncated { what: self.what });
        }
        let (a, b) = self.buf.split_at(n);
        self.buf = b;
        Ok(a)
    }

    pub fn u8(&mut self) -> Result<u8, ProtoError> {
        Ok(self.take(1)?[0])
    }
    pub fn u16(&mut self) -> Result<u16, ProtoError> {
        Ok(u16::from_le_bytes(self.take(2)?.try_into().unwrap()))
    }
    pub fn u32(&mut self) -> Result<u32, ProtoError> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    pub fn u64(&mut self) -> Result<u64, ProtoError> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn i64(&mut self) -> Result<i64, ProtoError> {
        Ok(i64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    pub fn varint(&mut self) -> Result<u64, ProtoError> {
        let mut v = 0u64;
        for i in 0..10 {
            let b = self.u8()?;
            if i == 9 && b > 1 {
                break;
            }
            v |= ((b & 0x7f) as u64) << (7 * i);
            if b & 0x80 == 0 {
                if b == 0 && i > 0 {
                    break;
                }
                return Ok(v);
            }
        }
        Err(ProtoError::Invalid {
            what: self.what,
            why: "overlong varint".into(),
        })
    }
    /// A count of items each at least `min_item` bytes long, bounded by what remains.
    pub fn count(&mut self, min_item: usize) -> Result<usize, ProtoError> {
        let n = self.varint()?;
        if n > (self.buf.len() / min_item.max(1)) as u64 {
            return Err(ProtoError::CountTooLarge {
                what: self.what,
                count: n,
                available: self.buf.len(),
            });
        }
        Ok(n as usize)
    }
    pub fn bytes(&mut self) -> Result<&'a [u8], ProtoError> {
        let n = self.count(1)?;
        self.take(n)
    }
    pub fn id(&mut self) -> Result<Id, ProtoError> {
        Ok(Id::from_bytes(self.take(TAGGED_ID_BYTES)?)?)
    }
    pub fn opt_id(&mut self) -> Result<Option<Id>, ProtoError> {
        match self.u8()? {
            0 => Ok(None),
            1 => Ok(Some(self.id()?)),
            t => Err(ProtoError::Invalid {
                what: self.what,
                why: format!("option tag {t}"),
            }),
        }
    }
    pub fn finish(self) -> Result<(), ProtoError> {
        if self.buf.is_empty() {
            Ok(())
        } else {
            Err(ProtoError::Trailing {
                what: self.what,
                extra: self.buf.len(),
            })
        }
    }
    pub fn take_exact(&mut self, n: usize) -> Result<&'a [u8], ProtoError> {
        self.take(n)
    }
    pub fn rest_len(&self) -> usize {
        self.buf.len()
    }
}
