//! Tickets: the one string a user passes along to let someone fetch an object (DOT's OID and
//! hints, with the capability that lets the holder read it, and the durability its create
//! met). Format: `docs/formats.md`, "Ticket v2".

use std::fmt;
use std::str::FromStr;

use ferry_format::{varint, Id, Oid};
use ferry_objects::{Capability, Rights};

/// What every ticket's text begins with (`2`: the version).
pub const PREFIX: &str = "ferry2";
/// Hints one ticket carries at most.
pub const MAX_HINTS: usize = 16;
/// Bytes of an encoded capability at most.
const MAX_CAP: usize = ferry_objects::caps::MAX_CAP_BYTES;
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
    /// The capability to present there, when it is not the ticket's (a replica's own).
    #[serde(skip)]
    pub cap: Option<Capability>,
}

impl Hint {
    pub fn new(uri: impl Into<String>, priority: u16, weight: u16) -> Hint {
        Hint {
            uri: uri.into(),
            priority,
            weight,
            cap: None,
        }
    }
}

/// An object's OID, size, capability, the durability its create met, and hints.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ticket {
    pub oid: Oid,
    pub size: u64,
    pub cap: Capability,
    pub durability: u8,
    pub hints: Vec<Hint>,
}

#[derive(Debug, thiserror::Error)]
#[error("not a ticket: {0}")]
pub struct BadTicket(String);

impl Ticket {
    /// The binary form (`docs/formats.md`).
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(160 + self.hints.len() * 64);
        put_cap(&mut b, Some(&self.cap));
        b.extend_from_slice(&self.oid.0.to_bytes());
        varint::put(&mut b, self.size);
        b.push(self.durability);
        varint::put(&mut b, self.hints.len() as u64);
        for h in &self.hints {
            b.extend_from_slice(&h.priority.to_le_bytes());
            b.extend_from_slice(&h.weight.to_le_bytes());
            varint::put(&mut b, h.uri.len() as u64);
            b.extend_from_slice(h.uri.as_bytes());
            put_cap(&mut b, h.cap.as_ref());
        }
        b
    }

    /// The capability to present to the peer `hint` names.
    pub fn cap_for(&self, hint: &Hint) -> Capability {
        hint.cap.clone().unwrap_or_else(|| self.cap.clone())
    }

    /// The capability to present to the peer at `uri` (one of the hints' URIs).
    pub fn cap_for_uri(&self, uri: &str) -> Capability {
        match self.hints.iter().find(|h| h.uri == uri) {
            Some(h) => self.cap_for(h),
            None => self.cap.clone(),
        }
    }

    /// A ticket whose capabilities carry at most `keep` (made without asking any server).
    pub fn restrict(&self, keep: Rights) -> Result<Ticket, ferry_objects::BadCapability> {
        let mut t = self.clone();
        t.cap = self.cap.restrict(keep)?;
        for h in &mut t.hints {
            if let Some(c) = &h.cap {
                h.cap = Some(c.restrict(keep)?);
            }
        }
        Ok(t)
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
        let get_cap = |b: &mut &[u8]| -> Result<Option<Capability>, BadTicket> {
            let n = varint::get(b, "capability").map_err(|e| bad(&e.to_string()))?;
            if n == 0 {
                return Ok(None);
            }
            if n > ferry_objects::caps::MAX_CAP_BYTES as u64 {
                return Err(BadTicket(format!("a capability of {n} bytes")));
            }
            let c = take(b, n as usize, "capability")?;
            Capability::from_bytes(&c)
                .map(Some)
                .map_err(|e| BadTicket(e.to_string()))
        };
        let cap = get_cap(&mut b)?.ok_or_else(|| bad("no capability"))?;
        let oid = Id::from_bytes(&take(&mut b, 33, "object id")?)
            .map_err(|e| BadTicket(format!("its object id: {e}")))?;
        let size = varint::get(&mut b, "size").map_err(|e| bad(&e.to_string()))?;
        let durability = take(&mut b, 1, "durability")?[0];
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
                cap: get_cap(&mut b)?,
            });
        }
        if !b.is_empty() {
            return Err(BadTicket(format!("{} bytes after its end", b.len())));
        }
        Ok(Ticket {
            oid: Oid(oid),
            size,
            cap,
            durability,
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

fn put_cap(b: &mut Vec<u8>, cap: Option<&Capability>) {
    match cap {
        Some(c) => {
            let c = c.to_bytes();
            varint::put(b, c.len() as u64);
            b.extend_from_slice(&c);
        }
        None => b.push(0),
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
        if body.len() > 8 * (MAX_HINTS * (MAX_URI + 8 + MAX_CAP) + 256) / 5 {
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

    fn cap(fill: u8) -> Capability {
        Capability {
            server: [fill; 16],
            number: 5,
            masks: vec![],
            check: [fill; 32],
        }
    }

    fn sample() -> Ticket {
        let mut replica = Hint::new("ferry://r:2", 2, 0);
        replica.cap = Some(cap(0xd8));
        Ticket {
            oid: Oid(Id::from_parts(HashAlg::Blake3, [0xa1; 32])),
            size: 300,
            cap: cap(0xc7),
            durability: 1,
            hints: vec![Hint::new("ferry://h:1", 1, 2), replica],
        }
    }

    fn cap_hex(fill: &str) -> String {
        format!(
            "3a 01 {} 0500000000000000 00 {}",
            fill.repeat(16),
            fill.repeat(32)
        )
    }

    #[test]
    fn encoding_is_pinned() {
        let t = sample();
        let want = format!(
            "{} 01{} ac02 01 02 0100 0200 0b {} 00 0200 0000 0b {} {}",
            cap_hex("c7"),
            "a1".repeat(32),
            hex::encode("ferry://h:1"),
            hex::encode("ferry://r:2"),
            cap_hex("d8"),
        )
        .replace(' ', "");
        assert_eq!(hex::encode(t.to_bytes()), want);
        let text = t.to_string();
        assert_eq!(
            text,
            "ferry2hia4pr6hy7d4pr6hy7d4pr6hy7d4obiaaaaaaaaaaaampr6hy7d4pr6hy7d4pr6hy7d4pr6hy7d4pr6hy7\
             d4pr6hy7d4prybugq2dinbugq2dinbugq2dinbugq2dinbugq2dinbugq2dinbugq2yaqbaiaqaaqabntgk4tspe\
             5c6l3ihiyqaaqaaaaawztfojzhsorpf5zdumr2ahmnrwgy3dmnrwgy3dmnrwgy3dmakaaaaaaaaaaaadmnrwgy3d\
             mnrwgy3dmnrwgy3dmnrwgy3dmnrwgy3dmnrwgy3dmnq"
        );
        assert_eq!(text.parse::<Ticket>().unwrap(), t);
        let upper = text.to_ascii_uppercase().replace("FERRY2", "ferry2");
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
        for bad in ["", "ferry2", "ferry1ae", "ferry2!!", "nope", "ferry2aaaa"] {
            assert!(bad.parse::<Ticket>().is_err(), "{bad}");
        }
    }

    #[test]
    fn hostile_counts_are_refused() {
        let at = 59 + 33 + 2 + 1;
        let mut b = sample().to_bytes();
        b[at] = 0x7f;
        assert!(Ticket::from_bytes(&b).is_err());
        let mut b = sample().to_bytes();
        b[at + 5] = 0xff;
        b.insert(at + 6, 0x7f);
        assert!(Ticket::from_bytes(&b).is_err());
    }

    #[test]
    fn restricting_restricts_every_capability() {
        let secret = [1; 32];
        let own = Capability::mint(&secret, [2; 16], 9, &[3; 16]);
        let mut t = sample();
        t.cap = own.clone();
        t.hints[1].cap = Some(own.clone());
        let r = t.restrict(Rights::READ).unwrap();
        assert_eq!(r.cap.rights(), Rights::READ);
        assert_eq!(r.hints[1].cap.as_ref().unwrap().rights(), Rights::READ);
        assert!(r.restrict(Rights::READ).is_err());
    }

    #[test]
    fn hints_go_by_priority_then_weight() {
        let h = |uri: &str, priority, weight| Hint::new(uri, priority, weight);
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
