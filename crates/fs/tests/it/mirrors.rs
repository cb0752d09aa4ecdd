//! `--mirror`: other servers holding the same tree serve chunks in parallel with the first,
//! by id or by place; one whose link is cut, or whose copy is stale, costs time, never wrong
//! bytes.

use super::*;

/// A session with a server on a thread serving `root`, whose link (the server's replies) is
/// cut after `cut` bytes, if given.
fn mirror_session(root: &Path, cut: Option<usize>) -> ferry_fs::Session {
    let b = serving(root);
    let Some(cut) = cut else {
        let w: ferry_fs::LinkWriter = Box::new(b.try_clone().unwrap());
        return ferry_fs::Session::over(b, w, Box::new(|| Ok(()))).unwrap();
    };
    // Through a relay that hangs up after `cut` bytes of replies.
    let c = relay_cut(b, cut);
    let w: ferry_fs::LinkWriter = Box::new(c.try_clone().unwrap());
    ferry_fs::Session::over(c, w, Box::new(|| Ok(()))).unwrap()
}

/// A fetch from `primary` with mirrors: returns the stats.
fn get_mirrored(
    primary: &Path,
    mirrors: Vec<(ferry_fs::Session, &str)>,
    dest: &Path,
) -> Result<GetStats, GetError> {
    let mut c = connect(primary);
    let cache = MemStore::new(ferry_format::HashAlg::Blake3);
    // A cache that is not empty: files come by recipe (a mirror serves chunks, not ranges).
    let other = ferry_store::VerifiedChunk::hash(ferry_format::HashAlg::Blake3, b"other");
    ferry_store::ChunkStore::put(&cache, &other).unwrap();
    let mirrors = std::sync::Mutex::new(
        mirrors
            .into_iter()
            .map(|(session, root)| ferry_fs::Mirror {
                session,
                root: WirePath::new(root.as_bytes().to_vec()).unwrap(),
                of: WirePath::new(b"t".to_vec()).unwrap(),
                name: format!("mirror {root}"),
                by_id: false,
            })
            .collect(),
    );
    let src = Sources {
        borrowing: true,
        cache: &cache,
        chunker: ChunkerSpec::default(),
        delete: false,
        dry_run: false,
        progress: None,
        lookaside: None,
        cold: false,
        ranges: false,
        short_ids: false,
        cache_file_max: u64::MAX,
        mirrors: Some(&mirrors),
    };
    let mut stats = GetStats::default();
    ferry_fs::get(&mut c, &"t".into(), dest, &src, &mut stats)?;
    Ok(stats)
}

/// A tree of `files` files of 1 MB each under `root/t`.
fn big_tree(root: &Path, files: u64) {
    fs::create_dir_all(root.join("t/d")).unwrap();
    for i in 0..files {
        fs::write(root.join(format!("t/d/f{i}")), bytes(500 + i, 1 << 20)).unwrap();
    }
}

#[test]
fn a_mirror_that_never_cut_the_files_serves_chunks_by_place() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    big_tree(&a, 8);
    // The mirror holds the same tree under another name.
    fs::create_dir_all(b.join("copy")).unwrap();
    std::process::Command::new("cp")
        .args([
            "-a",
            a.join("t").to_str().unwrap(),
            b.join("copy/t").to_str().unwrap(),
        ])
        .status()
        .unwrap();
    let dest = t.path().join("dest");
    let s = get_mirrored(&a, vec![(mirror_session(&b, None), "copy/t")], &dest).unwrap();
    same_tree(&a.join("t"), &dest);
    // The engine hands the mirror batches from the start (~1,000 chunks; four batches of 256
    // outstanding at the first server, the next at the mirror), however the two then race.
    let mirror = s
        .sources
        .iter()
        .find(|m| m.name == "mirror copy/t")
        .expect("a mirror");
    assert!(mirror.requests > 0, "{s:?}");
    assert_eq!(mirror.misses, 0, "{s:?}");
}

#[test]
fn a_mirror_whose_link_is_cut_leaves_the_rest_to_the_first_server() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    big_tree(&a, 8);
    fs::create_dir_all(&b).unwrap();
    std::process::Command::new("cp")
        .args([
            "-a",
            a.join("t").to_str().unwrap(),
            b.join("t").to_str().unwrap(),
        ])
        .status()
        .unwrap();
    let dest = t.path().join("dest");
    let mirror = mirror_session(&b, Some(600_000));
    let s = get_mirrored(&a, vec![(mirror, "t")], &dest).unwrap();
    same_tree(&a.join("t"), &dest);
    assert!(s.from_mirrors * 8192 < 600_000 + 100_000, "{s:?}");
    let m = s
        .sources
        .iter()
        .find(|m| m.name == "mirror t")
        .expect("a mirror");
    assert!(m.failed.is_some(), "{s:?}");
}

#[test]
fn a_stale_mirror_costs_time_never_wrong_bytes() {
    let t = tempfile::tempdir().unwrap();
    let (a, b) = (t.path().join("a"), t.path().join("b"));
    big_tree(&a, 4);
    // The mirror's copy is of other versions: every chunk it reads at the places named is
    // wrong, and each goes to the first server.
    big_tree(&b, 0);
    for i in 0..4 {
        fs::write(b.join(format!("t/d/f{i}")), bytes(900 + i, 1 << 20)).unwrap();
    }
    let dest = t.path().join("dest");
    let s = get_mirrored(&a, vec![(mirror_session(&b, None), "t")], &dest).unwrap();
    same_tree(&a.join("t"), &dest);
    assert_eq!(s.from_mirrors, 0, "{s:?}");
}
