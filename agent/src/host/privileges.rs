//! Whether this process holds CAP_NET_ADMIN, from `/proc/self/status`.

const CAP_NET_ADMIN: u32 = 12;

/// `Some(true)` when the effective capability set has CAP_NET_ADMIN, `None` when it cannot be
/// read.
pub fn has_net_admin() -> Option<bool> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    cap_eff_has(&status, CAP_NET_ADMIN)
}

fn cap_eff_has(status: &str, cap: u32) -> Option<bool> {
    let hex = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))?
        .trim();
    let bits = u64::from_str_radix(hex, 16).ok()?;
    Some(bits & (1 << cap) != 0)
}

/// The running kernel's release (`uname -r`) and its (major, minor).
pub fn kernel_release() -> Option<(String, (u32, u32))> {
    let u = nix::sys::utsname::uname().ok()?;
    let release = u.release().to_string_lossy().into_owned();
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((release, (major, minor)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_effective_set() {
        let s = "Name:\tx\nCapInh:\t0000000000000000\nCapEff:\t0000000000001000\n";
        assert_eq!(cap_eff_has(s, 12), Some(true));
        assert_eq!(cap_eff_has(s, 13), Some(false));
        assert_eq!(cap_eff_has("Name: x\n", 12), None);
    }
}
