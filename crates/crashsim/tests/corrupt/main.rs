//! Corruption campaigns on what Ferry keeps at rest: the chunk store (packs, index, marker; the
//! client's cache is one too) and the vault on a directory (config, key slots, heads, nodes,
//! blocks). One damage per trial; wrong bytes are never returned with success, what is damaged
//! is named, and data the damage did not touch stays readable. `FERRY_LONG=1` runs
//! `FERRY_CAMPAIGN_TRIALS` trials per campaign (50,000 by default), CI a few hundred.

mod store;
mod vault;

use ferry_crashsim::corrupt::Tally;

pub fn bytes(seed: u64, len: usize) -> Vec<u8> {
    let mut v = vec![0; len];
    blake3::Hasher::new_derive_key("ferry corruption campaigns")
        .update(&seed.to_le_bytes())
        .finalize_xof()
        .fill(&mut v);
    v
}

/// Trials per campaign.
pub fn trials() -> u64 {
    let long = std::env::var_os("FERRY_LONG").is_some_and(|v| v != "0");
    match std::env::var("FERRY_CAMPAIGN_TRIALS")
        .ok()
        .and_then(|s| s.parse().ok())
    {
        Some(n) => n,
        None if long => 50_000,
        None => 150,
    }
}

pub fn seed() -> u64 {
    std::env::var("FERRY_CRASH_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0xc0ffee)
}

pub fn report(name: &str, r: Result<Tally, String>) {
    match r {
        Ok(t) => {
            eprintln!(
                "{name}: {} corruptions, {} caught, {} harmless, 0 wrong",
                t.tried, t.caught, t.harmless
            );
            assert!(
                t.caught > 0,
                "{name}: a campaign that catches nothing proves nothing"
            );
        }
        Err(e) => panic!("{name}: {e}"),
    }
}
