//! Support for this crate's tests, unit and integration alike (hidden: not a stable API).

/// A seed from `RGK_SEED` if set (to replay a failure), else from the clock; printed with `test`'s name
/// so every run can be replayed.
pub fn seed(test: &str) -> u64 {
    let seed = std::env::var("RGK_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |d| d.as_nanos() as u64)
        });
    println!("{test}: seed {seed} (replay with RGK_SEED={seed})");
    seed
}
