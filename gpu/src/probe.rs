//! A cheap answer to "could this machine have a hardware GPU?", asked before opening a wgpu
//! instance: on a headless Linux machine the Vulkan loader and Mesa take about a second to
//! enumerate (compiling lavapipe, probing EGL) and print warnings to the terminal, all to find
//! only a software adapter that `--backend auto` would not use anyway.

/// False only where no GPU device can exist: on Linux, when there is no DRM render node
/// (`/dev/dri/renderD*`), no NVIDIA device (`/dev/nvidia*`) and no WSL GPU (`/dev/dxg`).
/// Elsewhere (macOS, Windows, …) always true: wgpu is asked.
pub fn hardware_gpu_possible() -> bool {
    #[cfg(target_os = "linux")]
    {
        let dir_has = |dir: &str, prefix: &str| {
            std::fs::read_dir(dir).is_ok_and(|entries| {
                entries
                    .flatten()
                    .any(|e| e.file_name().to_string_lossy().starts_with(prefix))
            })
        };
        dir_has("/dev/dri", "renderD")
            || dir_has("/dev", "nvidia")
            || std::path::Path::new("/dev/dxg").exists()
    }
    #[cfg(not(target_os = "linux"))]
    {
        true
    }
}
