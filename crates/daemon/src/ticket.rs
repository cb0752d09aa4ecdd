//! Tickets: the one string a user passes along to let someone fetch an object (DOT's OID and
//! hints, with the capability that lets the holder read it). Format: `docs/formats.md`,
//! "Ticket v1".

use std::fmt;
use std::str::FromStr;

use ferry_format::{varint, Id, Oid};
use ferry_proto::CAP_BYTES;

/// What every ticket's text begins with (`1`: the version).
pub const PREFIX: &str = "ferry1";
/// Hints one ticket carries at most.
pub const MAX_HINTS: usize = 16;
/// Bytes of one hint's URI at most.
pub const MAX_URI: usize = 1024;

/// Where an object may be found (DOT's hint): a method URI naming a plugin and its data
/// (`ferry://host:port?key=FINGERPRINT`, `dir:///media/usb`), with SRV semantics: lowest
/// priority first, weight as the chance among equals.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Hint {
    pub uri: String,
    pub priority: u16,
    pub weight: u16,
}

/// An object's OID, size, read capability and hints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub oid: Oid,
    pub size: u64,
    pub cap: [u8; CAP_BYTES],
    pub hints: Vec<Hint>,
}

#[derive(Debug, thiserror::Error)]
#[error("not a ticket: {0}")]
pub struct BadTicket(String);

impl Ticket {
    /// The binary form (`docs/formats.md`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(80 + self.hints.len() * 64);
        b.extend_from_slice(&self.oid.0.to_bytes());
        varint::put(&mut b, self.size);
        b.extend_from_slice(&self.cap);
        varint::put(&mut b, self.hints.len() as u64);
        for h in &self.hints {
            b.extend_from_slice(&h.priority.to_le_bytes());
            b.extend_from_slice(&h.weight.to_le_bytes());
            varint::put(&mut b, h.uri.len() as u64);
            b.extend_from_slice(h.uri.as_bytes());
        }
        b
    }

    pub fn from_bytes(mut b: &[u8]) -> Result<Ticket, BadTicket> {
        let bad = |why: &str| BadTicket(why.to_string());
        let take = |b: &mut &[u8], n: usize, what: &str| -> Result<Vec<u8>, BadTicket> {
            if b.len() < n {
                return Err(BadTicket(format!("cut short in its {what}")));
            }
            let (head, rest) = b.split_at(n);
            *b = rest;
            Ok(head.to_vec())
        };
        let oid = Id::from_bytes(&take(&mut b, 33, "object id")?)
            .map_err(|e| BadTicket(format!("its object id: {e}")))?;
        let size = varint::get(&mut b, "size").map_err(|e| bad(&e.to_string()))?;
        let mut cap = [0u8; CAP_BYTES];
        cap.copy_from_slice(&take(&mut b, CAP_BYTES, "capability")?);
        let n = varint::get(&mut b, "hints").map_err(|e| bad(&e.to_string()))?;
        if n > MAX_HINTS as u64 {
            return Err(BadTicket(format!("{n} hints (at most {MAX_HINTS})")));
        }
        let mut hints = Vec::with_capacity(n as usize);
        for _ in 0..n {
            let p = take(&mut b, 4, "hint")?;
            let len = varint::get(&mut b, "hint").map_err(|e| bad(&e.to_string()))?;
            if len > MAX_URI as u64 {
                return Err(BadTicket(format!("a hint of {len} bytes")));
            }
            let uri = String::from_utf8(take(&mut b, len as usize, "hint")?)
                .map_err(|_| bad("a hint is not UTF-8"))?;
            hints.push(Hint {
                uri,
                priority: u16::from_le_bytes([p[0], p[1]]),
                weight: u16::from_le_bytes([p[2], p[3]]),
            });
        }
        if !b.is_empty() {
            return Err(BadTicket(format!("{} bytes after its end", b.len())));
        }
        Ok(Ticket {
            oid: Oid(oid),
            size,
            cap,
            hints,
        })
    }

    /// The hints in the order to try them: by priority, and among equal priorities at random
    /// weighted by weight (RFC 2782's selection), with `roll` giving the random numbers.
    pub fn ordered_hints(&self, mut roll: impl FnMut(u32) -> u32) -> Vec<Hint> {
        let mut left = self.hints.clone();
        left.sort_by_key(|h| h.priority);
        let mut out = Vec::with_capacity(left.len());
        while !left.is_empty() {
            let p = left[0].priority;
            let same = left.iter().take_while(|h| h.priority == p).count();
            let total: u32 = left[..same].iter().map(|h| h.weight as u32).sum();
            let mut at = roll(total + 1);
            let mut pick = 0;
            for (i, h) in left[..same].iter().enumerate() {
                pick = i;
                if at <= h.weight as u32 {
                    break;
                }
                at -= h.weight as u32;
            }
            out.push(left.remove(pick));
        }
        out
    }
}

impl fmt::Display for Ticket {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let text = data_encoding::BASE32_NOPAD.encode(&self.to_bytes());
        write!(f, "{PREFIX}{}", text.to_ascii_lowercase())
    }
}

impl FromStr for Ticket {
    type Err = BadTicket;
    fn from_str(s: &str) -> Result<Ticket, BadTicket> {
        let body = s.trim().strip_prefix(PREFIX).ok_or_else(|| {
            BadTicket(format!(
                "a ticket begins with {PREFIX:?} (this one: {:.12?})",
                s.trim()
            ))
        })?;
        if body.len() > 8 * (MAX_HINTS * (MAX_URI + 8) + 128) / 5 {
            return Err(BadTicket(format!("{} characters is too long", body.len())));
        }
        let bytes = data_encoding::BASE32_NOPAD
            .decode(body.to_ascii_uppercase().as_bytes())
            .map_err(|e| BadTicket(format!("not base32 ({e})")))?;
        Ticket::from_bytes(&bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_format::HashAlg;

    fn sample() -> Ticket {
        Ticket {
            oid: Oid(Id::from_parts(HashAlg::Blake3, [0xa1; 32])),
            size: 300,
            cap: [0xc7; CAP_BYTES],
            hints: vec![Hint {
                uri: "ferry://h:1".into(),
                priority: 1,
                weight: 2,
            }],
        }
    }

    #[test]
    fn encoding_is_pinned() {
        let t = sample();
        let want = format!(
            "01{} ac02 {} 01 0100 0200 0b {}",
            "a1".repeat(32),
            "c7".repeat(32),
            hex::encode("ferry://h:1")
        )
        .replace(' ', "");
        assert_eq!(hex::encode(t.to_bytes()), want);
        let text = t.to_string();
        assert_eq!(
            text,
            "ferry1agq2dinbugq2dinbugq2dinbugq2dinbugq2dinbugq2dinbugq2dlacy7d4pr6hy7d4pr6hy7d4pr6\
             hy7d4pr6hy7d4pr6hy7d4pr6hy7dqcaiaaiaawztfojzhsorpf5udumi"
        );
        assert_eq!(text.parse::<Ticket>().unwrap(), t);
        let upper = text.to_ascii_uppercase().replace("FERRY1", "ferry1");
        assert_eq!(upper.parse::<Ticket>().unwrap(), t);
    }

    #[test]
    fn every_cut_and_flip_is_refused_or_differs() {
        let t = sample();
        let b = t.to_bytes();
        for cut in 0..b.len() {
            assert!(Ticket::from_bytes(&b[..cut]).is_err(), "cut at {cut}");
        }
        let mut long = b.clone();
        long.push(0);
        assert!(Ticket::from_bytes(&long).is_err());
        for i in 0..b.len() * 8 {
            let mut f = b.clone();
            f[i / 8] ^= 1 << (i % 8);
            if let Ok(u) = Ticket::from_bytes(&f) {
                assert_ne!(u, t, "flip {i}");
            }
        }
        for bad in ["", "ferry1", "ferry2ae", "ferry1!!", "nope", "ferry1aaaa"] {
            assert!(bad.parse::<Ticket>().is_err(), "{bad}");
        }
    }

    #[test]
    fn hostile_counts_are_refused() {
        let mut b = sample().to_bytes();
        let at = 33 + 2 + 32;
        b[at] = 0x7f;
        assert!(Ticket::from_bytes(&b).is_err());
        let mut b = sample().to_bytes();
        b[at + 5] = 0xff;
        b.insert(at + 6, 0x7f);
        assert!(Ticket::from_bytes(&b).is_err());
    }

    #[test]
    fn hints_go_by_priority_then_weight() {
        let h = |uri: &str, priority, weight| Hint {
            uri: uri.into(),
            priority,
            weight,
        };
        let mut t = sample();
        t.hints = vec![h("c", 2, 1), h("a", 1, 0), h("b", 1, 5)];
        // A roll of 0 takes the first of the lowest priority; the largest, the last.
        let firsts: Vec<String> = t.ordered_hints(|_| 0).into_iter().map(|h| h.uri).collect();
        assert_eq!(firsts, ["a", "b", "c"]);
        let lasts: Vec<String> = t
            .ordered_hints(|n| n - 1)
            .into_iter()
            .map(|h| h.uri)
            .collect();
        assert_eq!(lasts, ["b", "a", "c"]);
    }
}
