//! Where objects lie: extents in data files, allocated first fit, holes merged when freed. The
//! map is never stored: it is rebuilt from the inode table when the store opens, so a crash
//! cannot leak or double-book space.

use std::collections::BTreeMap;

/// One object's bytes: `len` bytes at `offset` of data file `file`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Extent {
    pub file: u32,
    pub offset: u64,
    pub len: u64,
}

impl Extent {
    pub fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// The free space of the data files.
#[derive(Debug, Default, Clone)]
pub struct Space {
    /// Bytes in use up to, per data file (a file's bytes past it are free).
    ends: Vec<u64>,
    /// Holes below the ends: (file, offset) → length.
    holes: BTreeMap<(u32, u64), u64>,
    /// A file is not grown past this (an object larger than it gets a file of its own).
    file_max: u64,
}

impl Space {
    /// The space of files holding `used` extents (any order), `files` files at least.
    pub fn rebuild(files: u32, mut used: Vec<Extent>, file_max: u64) -> Space {
        used.retain(|e| e.len > 0);
        used.sort();
        let n = used
            .iter()
            .map(|e| e.file + 1)
            .max()
            .unwrap_or(0)
            .max(files);
        let mut s = Space {
            ends: vec![0; n as usize],
            holes: BTreeMap::new(),
            file_max,
        };
        for e in used {
            let end = &mut s.ends[e.file as usize];
            if e.offset > *end {
                s.holes.insert((e.file, *end), e.offset - *end);
            }
            *end = (*end).max(e.end());
        }
        s
    }

    pub fn files(&self) -> u32 {
        self.ends.len() as u32
    }

    pub fn end(&self, file: u32) -> u64 {
        self.ends.get(file as usize).copied().unwrap_or(0)
    }

    /// Bytes of holes (free space below the files' ends).
    pub fn hole_bytes(&self) -> u64 {
        self.holes.values().sum()
    }

    /// Bytes up to the files' ends.
    pub fn used_bytes(&self) -> u64 {
        self.ends.iter().sum()
    }

    /// The first hole (by file, then offset) that fits `len`, else the end of the first file
    /// with room, else a new file.
    pub fn allocate(&mut self, len: u64) -> Extent {
        if len == 0 {
            return Extent {
                file: 0,
                offset: 0,
                len: 0,
            };
        }
        let fit = self
            .holes
            .iter()
            .find(|(_, l)| **l >= len)
            .map(|(k, l)| (*k, *l));
        if let Some(((file, offset), hole)) = fit {
            self.holes.remove(&(file, offset));
            if hole > len {
                self.holes.insert((file, offset + len), hole - len);
            }
            return Extent { file, offset, len };
        }
        let room = self
            .ends
            .iter()
            .position(|end| *end > 0 && end + len <= self.file_max);
        let file = room.unwrap_or_else(|| match self.ends.iter().position(|end| *end == 0) {
            Some(f) => f,
            None => {
                self.ends.push(0);
                self.ends.len() - 1
            }
        });
        let offset = self.ends[file];
        self.ends[file] += len;
        Extent {
            file: file as u32,
            offset,
            len,
        }
    }

    /// The first hole before `e` (in file order) that `e` fits in, if any: where compaction
    /// would move it.
    pub fn lower_fit(&self, e: &Extent) -> Option<Extent> {
        self.holes
            .range(..(e.file, e.offset))
            .find(|(_, l)| **l >= e.len)
            .map(|((file, offset), _)| Extent {
                file: *file,
                offset: *offset,
                len: e.len,
            })
    }

    /// Takes exactly `e` out of a hole (it must lie in one).
    pub fn take(&mut self, e: &Extent) {
        let (&(file, offset), &len) = self
            .holes
            .range(..=(e.file, e.offset))
            .next_back()
            .expect("the extent lies in a hole");
        assert!(file == e.file && offset + len >= e.end(), "not in a hole");
        self.holes.remove(&(file, offset));
        if e.offset > offset {
            self.holes.insert((file, offset), e.offset - offset);
        }
        if offset + len > e.end() {
            self.holes.insert((file, e.end()), offset + len - e.end());
        }
    }

    /// Frees `e`, merging it with the holes beside it; space at a file's end shortens the file.
    pub fn free(&mut self, e: Extent) {
        if e.len == 0 {
            return;
        }
        let (mut offset, mut len) = (e.offset, e.len);
        if let Some((&(f, o), &l)) = self.holes.range(..(e.file, e.offset)).next_back() {
            if f == e.file && o + l == offset {
                self.holes.remove(&(f, o));
                offset = o;
                len += l;
            }
        }
        if let Some(&l) = self.holes.get(&(e.file, offset + len)) {
            self.holes.remove(&(e.file, offset + len));
            len += l;
        }
        let end = &mut self.ends[e.file as usize];
        if offset + len >= *end {
            *end = offset;
        } else {
            self.holes.insert((e.file, offset), len);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn first_fit_reuses_holes_and_merges() {
        let mut s = Space::rebuild(0, vec![], 1000);
        let a = s.allocate(100);
        let b = s.allocate(200);
        let c = s.allocate(50);
        assert_eq!((a.offset, b.offset, c.offset), (0, 100, 300));
        s.free(a);
        s.free(b);
        assert_eq!(s.hole_bytes(), 300);
        let d = s.allocate(250);
        assert_eq!((d.file, d.offset), (0, 0));
        s.free(c);
        assert_eq!(s.end(0), 250);
        assert_eq!(s.hole_bytes(), 0);
        // Past a file's limit: a new file.
        let e = s.allocate(900);
        assert_eq!((e.file, e.offset), (1, 0));
        let big = s.allocate(5000);
        assert_eq!((big.file, big.offset), (2, 0));
    }

    proptest! {
        /// Allocations never overlap; freeing everything leaves nothing; a rebuild from the
        /// extents in use gives the same free space.
        #[test]
        fn never_overlaps(ops in proptest::collection::vec((0u64..300, any::<bool>()), 1..200)) {
            let mut s = Space::rebuild(0, vec![], 2000);
            let mut live: Vec<Extent> = vec![];
            for (len, free) in ops {
                if free && !live.is_empty() {
                    let e = live.remove(len as usize % live.len());
                    s.free(e);
                } else {
                    let e = s.allocate(len + 1);
                    for o in &live {
                        prop_assert!(o.file != e.file || o.end() <= e.offset || e.end() <= o.offset);
                    }
                    live.push(e);
                }
                let r = Space::rebuild(s.files(), live.clone(), 2000);
                prop_assert_eq!(&r.holes, &s.holes);
                prop_assert_eq!(&r.ends, &s.ends);
            }
            for e in live.drain(..) {
                s.free(e);
            }
            prop_assert_eq!(s.used_bytes(), 0);
            prop_assert_eq!(s.hole_bytes(), 0);
        }
    }
}
