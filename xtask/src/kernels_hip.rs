//! `cargo xtask kernels`, HIP part: compile every `kernels-hip/*.hip` file without an AMD GPU.
//!
//! 1. hipcc (Debian's ROCm 5.2, clang 15): `hipcc --genco --offload-arch=gfx90a
//!    --offload-arch=gfx940` with vt-hip's options plus `-Wall -Wextra -Werror`; a file passes
//!    for an architecture when hipcc succeeds and the bundle holds that architecture's code
//!    object. (That clang knows no gfx942; vt-hip compiles for the device's own target at run
//!    time, so MI300X is served by the user's hiprtc.)
//! 2. hiprtc, through vt-hip's own compile path (in-memory headers, same options, no disk
//!    cache), for gfx90a (64-wide waves) and gfx1030 (32-wide; Debian's hiprtc aborts on
//!    gfx940, see `RTC_ARCHS`); then every launch vt-hip plans for sample arguments
//!    of every op is checked against the compiled kernels' metadata (argument count, sizes
//!    and kinds, workgroup limit, shared memory), see `vt_hip::selfcheck`.
//! 3. The probe: on a machine without `/dev/kfd` it must report `no device` (libamdhip64 is
//!    installed by `.ci/kernels-hip-deps`, so `unavailable` would mean it failed to load).
//!
//! hipcc is `$HIPCC` or `hipcc` on the PATH; `.ci/kernels-hip-deps` installs it.

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use vt_core::Probe;
use vt_hip::{compile, selfcheck, Libraries};

use crate::kernels::{kernel_files, Outcome};

/// hipcc targets: CDNA2 (MI200) and CDNA3 (MI300A/X as clang 15 names them).
const ARCHS: [&str; 2] = ["gfx90a", "gfx940"];
/// hiprtc targets: Debian's hiprtc (comgr of ROCm 5.2) aborts the process on targets it
/// does not know (gfx940, gfx1100), so it checks CDNA2 (64-wide waves) and RDNA2 gfx1030
/// (32-wide waves), which covers both wave sizes.
const RTC_ARCHS: [&str; 2] = ["gfx90a", "gfx1030"];

pub fn run(root: &Path) -> Result<(String, Vec<Outcome>), String> {
    let start = Instant::now();
    let hipcc = std::env::var("HIPCC").unwrap_or_else(|_| "hipcc".into());
    let version = Command::new(&hipcc).arg("--version").output().map_err(|e| {
        format!(
            "{hipcc} not found ({e}): `source .ci/kernels-hip-deps` (apt-get install hipcc libamdhip64-dev)"
        )
    })?;
    let version = String::from_utf8_lossy(&version.stdout);
    let version: Vec<&str> = version.lines().filter(|l| l.contains("version")).collect();

    let dir = root.join("kernels-hip");
    let out_dir = std::env::temp_dir().join(format!("vt-kernels-hip-{}", std::process::id()));
    std::fs::create_dir_all(&out_dir).map_err(|e| format!("creating {}: {e}", out_dir.display()))?;
    let files = kernel_files(&dir, "hip")?;
    // One hipcc per file, as many at a time as there are cores.
    let next = AtomicUsize::new(0);
    let workers = std::thread::available_parallelism().map_or(1, |n| n.get()).min(files.len());
    let results: Mutex<Vec<(usize, Vec<Outcome>)>> = Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..workers {
            scope.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(path) = files.get(i) else { break };
                let o = hipcc_file(&hipcc, &dir, path, &out_dir);
                if let Ok(mut r) = results.lock() {
                    r.push((i, o));
                }
            });
        }
    });
    let mut results = results.into_inner().map_err(|_| "a hipcc worker panicked".to_string())?;
    results.sort_by_key(|(i, _)| *i);
    let mut outcomes: Vec<Outcome> = results.into_iter().flat_map(|(_, o)| o).collect();
    let _ = std::fs::remove_dir_all(&out_dir);

    // hiprtc: vt-hip's run-time path, and the host/kernel agreement check.
    let libs = Libraries::default();
    let mut rtc_version = String::from("hiprtc not loaded");
    for arch in RTC_ARCHS {
        let t0 = Instant::now();
        let report = selfcheck::run(&libs, arch, None).map_err(|e| {
            format!("hiprtc not available ({e}): `source .ci/kernels-hip-deps` installs libamdhip64")
        })?;
        eprintln!("hiprtc {arch} + launch check: {:.2} s", t0.elapsed().as_secs_f64());
        println!("{report}");
        rtc_version = format!("hiprtc {}.{}", report.hiprtc_version.0, report.hiprtc_version.1);
        // Short column names keep the table aligned: rtc90a = hiprtc for gfx90a.
        let col = format!("rtc{}", arch.trim_start_matches("gfx"));
        for (file, error) in &report.compiled {
            outcomes.push(Outcome { file: file.clone(), arch: col.clone(), error: error.clone() });
        }
        let mismatches: Vec<&String> =
            report.problems.iter().filter(|p| !p.contains("did not compile")).collect();
        outcomes.push(Outcome {
            file: "(planned launches vs kernels)".into(),
            arch: col,
            error: (!mismatches.is_empty())
                .then(|| mismatches.iter().map(|p| format!("- {p}")).collect::<Vec<_>>().join("\n")),
        });
    }

    // The probe with the library installed and (here) no AMD GPU.
    let probe = vt_hip::register();
    let kfd = Path::new("/dev/kfd").exists();
    let error = match (&probe, kfd) {
        (Probe::NoDevice { .. }, false) | (Probe::Registered { .. }, true) => None,
        _ => Some(format!("probe says `{probe}` with /dev/kfd {}", if kfd { "present" } else { "absent" })),
    };
    outcomes.push(Outcome { file: "(probe)".into(), arch: "host".into(), error });

    let secs = start.elapsed().as_secs_f64();
    Ok((
        format!(
            "kernels-hip: {}, {rtc_version} (columns rtc*); hip probe: {probe}; {secs:.1} s",
            version.join(" / ")
        ),
        outcomes,
    ))
}

/// Compiles one file for every target of [`ARCHS`]; one outcome per target.
fn hipcc_file(hipcc: &str, dir: &Path, path: &Path, out_dir: &Path) -> Vec<Outcome> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let out = out_dir.join(format!("{name}.co"));
    let t0 = Instant::now();
    let mut cmd = Command::new(hipcc);
    cmd.arg("--genco");
    cmd.args(ARCHS.iter().map(|a| format!("--offload-arch={a}")));
    cmd.args(compile::OPTIONS.iter().filter(|o| !o.starts_with("-DVT_HIPRTC")));
    cmd.args(["-Wall", "-Wextra", "-Werror", "-I"]).arg(dir).arg(path).arg("-o").arg(&out);
    let result = cmd.output();
    eprintln!("{name} hipcc: {:.2} s", t0.elapsed().as_secs_f64());
    let bundle = std::fs::read(&out).unwrap_or_default();
    ARCHS
        .iter()
        .map(|arch| {
            let error = match &result {
                Err(e) => Some(format!("running {hipcc}: {e}")),
                Ok(r) if !r.status.success() => {
                    Some(format!("hipcc exited with {}:\n{}", r.status, String::from_utf8_lossy(&r.stderr)))
                }
                Ok(_) if !contains(&bundle, format!("amdhsa--{arch}").as_bytes()) => {
                    Some(format!("hipcc succeeded but {} holds no {arch} code object", out.display()))
                }
                Ok(_) => None,
            };
            Outcome { file: name.clone(), arch: arch.to_string(), error }
        })
        .collect()
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    !needle.is_empty() && hay.windows(needle.len()).any(|w| w == needle)
}
