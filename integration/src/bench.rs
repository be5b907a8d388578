//! What the benchmarks share: their knobs, read from the environment.

/// `name` from the environment as an integer of at least `min`; `default` when it is unset.
pub fn env_usize(name: &str, default: usize, min: usize) -> Result<usize, String> {
    match std::env::var(name) {
        Err(_) => Ok(default),
        Ok(v) => match v.trim().parse::<usize>() {
            Ok(n) if n >= min => Ok(n),
            _ => Err(format!("{name}={v:?}: expected an integer >= {min}")),
        },
    }
}
