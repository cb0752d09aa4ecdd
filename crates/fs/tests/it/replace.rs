//! An upload replacing a version whose recipe the client knows (it committed that version):
//! one round trip, nothing asked; a recipe that is not the server's is refused whole.

use super::*;
use ferry_fs::{PutStats, Replacing};

fn put(
    c: &mut Connection<UnixStream, UnixStream>,
    local: &Path,
    replacing: Option<Replacing>,
) -> Result<(ferry_proto::Attr, PutStats), GetError> {
    let o = ferry_fs::PutOptions {
        fewer_round_trips: true,
        ..opts(false)
    };
    let mut stats = PutStats::default();
    let a = ferry_fs::put_file(
        c,
        local,
        &WirePath::from("f"),
        replacing,
        0o644,
        &o,
        &mut stats,
    )?;
    Ok((a, stats))
}

#[test]
fn a_version_whose_recipe_is_known_is_replaced_in_one_round_trip() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    let local = t.path().join("f");
    let mut data = bytes(1, 300_000);
    fs::write(&local, &data).unwrap();
    let mut c = connect(&srv);
    let (a, stats) = put(&mut c, &local, None).unwrap();
    let recipe = stats.last_recipe.expect("kept with fewer_round_trips");
    // An edit in the middle.
    data[150_000..150_010].copy_from_slice(b"0123456789");
    fs::write(&local, &data).unwrap();
    let known = Replacing {
        version: a.version,
        empty: false,
        recipe: Some(recipe),
    };
    let before = c.traffic();
    let (b, stats) = put(&mut c, &local, Some(known)).unwrap();
    let after = c.traffic();
    assert_eq!(after.round_trips - before.round_trips, 1);
    assert!(stats.chunk_bytes_sent < 100_000, "{stats:?}");
    assert!(after.bytes_sent - before.bytes_sent < 60_000);
    assert_eq!(fs::read(srv.join("f")).unwrap(), data);
    assert_ne!(b.version, a.version);
}

#[test]
fn a_known_recipe_that_is_not_the_servers_is_refused_and_changes_nothing() {
    let t = tempfile::tempdir().unwrap();
    let srv = t.path().join("srv");
    fs::create_dir(&srv).unwrap();
    let local = t.path().join("f");
    let old = bytes(2, 300_000);
    fs::write(&local, &old).unwrap();
    let mut c = connect(&srv);
    let (a, _) = put(&mut c, &local, None).unwrap();
    // The recipe of other content, named as that version's.
    fs::write(&local, bytes(3, 300_000)).unwrap();
    let second = Replacing {
        version: a.version,
        empty: false,
        recipe: None,
    };
    put(&mut c, &local, Some(second)).unwrap();
    let now = c
        .call(Request::GetAttr {
            path: WirePath::from("f"),
        })
        .unwrap();
    let Some(Reply::Attr(current)) = now.into_iter().next() else {
        panic!("no attributes")
    };
    let mut new = old.clone();
    new[10..20].copy_from_slice(b"abcdefghij");
    fs::write(&local, &new).unwrap();
    let wrong = Replacing {
        version: current.version,
        empty: false,
        recipe: Some(std::sync::Arc::new({
            // The first version's cut, not the current one's.
            let (r, _) = ferry_format::chunk_object::<_, std::io::Error, _>(
                &old[..],
                &ChunkerSpec::default(),
                ferry_format::HashAlg::Blake3,
                |_, _| Ok(()),
            )
            .unwrap();
            r
        })),
    };
    match put(&mut c, &local, Some(wrong)) {
        Err(GetError::Conn(ferry_fs::ConnError::Remote { code, .. })) => {
            assert!(
                matches!(code, ErrorCode::BadRequest | ErrorCode::MissingChunks),
                "{code:?}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(fs::read(srv.join("f")).unwrap(), bytes(3, 300_000));
    // Asked the usual way, it goes.
    let asked = Replacing {
        version: current.version,
        empty: false,
        recipe: None,
    };
    put(&mut c, &local, Some(asked)).unwrap();
    assert_eq!(fs::read(srv.join("f")).unwrap(), new);
}
