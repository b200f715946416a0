//! The wall clock, in one place. Ground floor: imports nothing from the
//! crate. Rules that depend on time (the brute-force and refresh state
//! machines, codes) take `now` as an argument and are tested without it;
//! only the code that feeds them reads this clock.

/// Milliseconds since the Unix epoch (0 if the clock is before it).
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}
