//! How much host memory a session may take: the kernel's estimate of memory available without
//! swapping, plus free swap (`/proc/meminfo`; Linux only, `None` elsewhere).

/// Bytes a new allocation can have now (`MemAvailable + SwapFree`), if the OS says.
pub fn available_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let available = field_kib(&text, "MemAvailable:")?;
    let swap = field_kib(&text, "SwapFree:").unwrap_or(0);
    available.checked_add(swap)?.checked_mul(1024)
}

/// The value in KiB of the `/proc/meminfo` line starting with `key`.
fn field_kib(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key))?
        .trim()
        .strip_suffix("kB")?
        .trim()
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_meminfo_fields() {
        let text = "MemTotal:       24000000 kB\nMemAvailable:   20000000 kB\nSwapFree:              0 kB\n";
        assert_eq!(field_kib(text, "MemAvailable:"), Some(20_000_000));
        assert_eq!(field_kib(text, "Missing:"), None);
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn this_machine_has_some_memory_available() {
        let bytes = available_bytes().expect("/proc/meminfo");
        assert!(bytes > 1 << 20, "{bytes}");
    }
}
