//! `cargo xtask kernels [--backend cuda,hip] [--file SUBSTRING]`: compile every GPU kernel file without a GPU.
//!
//! - CUDA: every `kernels-cuda/*.cu` with NVRTC, exactly as vt-cuda compiles it at run time
//!   (same options, same in-memory headers), for sm_80 and sm_90, and sm_100 when this
//!   NVRTC knows it. NVRTC and the headers come from the PyPI wheels that
//!   `.ci/kernels-cuda-deps` installs (it exports `LD_LIBRARY_PATH` and `VT_CUDA_INCLUDE`).
//! - HIP: see `kernels_hip.rs` (hipcc for gfx90a/gfx940, hiprtc through vt-hip with a check
//!   of every planned launch against the compiled kernels, and the no-device probe).
//!
//! Prints a table file x architecture (OK / FAIL) per backend, then the compiler log of
//! every failure, and exits non-zero if anything failed or a toolchain is missing.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

/// One file compiled for one architecture.
pub struct Outcome {
    /// File name inside the kernel folder (`rms_norm.cu`).
    pub file: String,
    /// Architecture name as shown in the table (`sm_90`, `gfx90a`).
    pub arch: String,
    /// `None` when it compiled; the compiler's log otherwise.
    pub error: Option<String>,
}

/// Runs `f` over `jobs` on all cores, keeping the jobs' order.
pub fn parallel_map<J: Send, R: Send>(jobs: Vec<J>, f: impl Fn(J) -> R + Sync) -> Vec<R> {
    let n = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    let queue = std::sync::Mutex::new(jobs.into_iter().enumerate().collect::<Vec<_>>());
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..n {
            s.spawn(|| loop {
                let job = queue.lock().ok().and_then(|mut q| q.pop());
                let Some((i, j)) = job else { break };
                let r = f(j);
                if let Ok(mut out) = results.lock() {
                    out.push((i, r));
                }
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_default();
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

/// `cargo xtask kernels` options.
#[derive(clap::Args, Debug)]
pub struct Args {
    /// Toolchains to check, comma-separated: cuda, hip.
    #[arg(long, value_name = "LIST", value_delimiter = ',', default_value = "cuda,hip", value_parser = ["cuda", "hip"])]
    pub backend: Vec<String>,
    /// Only kernel files whose name contains this (CUDA).
    #[arg(long, value_name = "SUBSTRING", default_value = "")]
    pub file: String,
    /// Instead of checking: compile every CUDA kernel file for `--sm` into the disk cache under
    /// DIR, as vt-cuda will ask for it on such a device (its texts with `VT_CUDA_KERNELS_DIR`'s
    /// overlays, its options and key), so that a process run there with `VT_CACHE_DIR=DIR`
    /// compiles nothing. The key holds the include paths: compile with the device's (e.g.
    /// `VT_CUDA_INCLUDE=/usr/local/cuda/include:/usr/local/cuda/include/cccl`).
    #[arg(long, value_name = "DIR")]
    pub warm_cache: Option<PathBuf>,
    /// The device architecture for `--warm-cache` (sm_XY as XY).
    #[arg(long, value_name = "XY", default_value_t = 90, requires = "warm_cache")]
    pub sm: u32,
}

pub fn run(args: Args) -> Result<ExitCode, String> {
    let root = workspace_root();
    if let Some(dir) = &args.warm_cache {
        return warm_cache(&root, &args.file, dir, args.sm);
    }
    let (backends, filter) = (args.backend, args.file);
    let mut ok = true;
    for b in &backends {
        let (title, outcomes) = match b.as_str() {
            "cuda" => cuda(&root, &filter)?,
            "hip" => crate::kernels_hip::run(&root)?,
            other => return Err(format!("unknown backend {other:?}")),
        };
        ok &= report(&title, &outcomes);
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

fn workspace_root() -> PathBuf {
    // xtask/ sits in the workspace root.
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| ".".into())
}

/// Every `*.{ext}` file of `dir`, sorted by name.
pub fn kernel_files(dir: &Path, ext: &str) -> Result<Vec<PathBuf>, String> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(|e| format!("reading {}: {e}", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == ext))
        .collect();
    files.sort();
    if files.is_empty() {
        return Err(format!("no *.{ext} files in {}", dir.display()));
    }
    Ok(files)
}

/// Compiles `kernels-cuda/*.cu` with NVRTC for every architecture we ship for.
fn cuda(root: &Path, filter: &str) -> Result<(String, Vec<Outcome>), String> {
    use vt_cuda::nvrtc::{self, Target};
    if !nvrtc::available() {
        return Err("libnvrtc.so.13 not found: `source .ci/kernels-cuda-deps` (installs the \
                    nvidia-cuda-nvrtc wheel and sets LD_LIBRARY_PATH)"
            .into());
    }
    let (major, minor) = nvrtc::version().map_err(|e| e.to_string())?;
    let includes = nvrtc::include_dirs().map_err(|e| e.to_string())?;
    let supported = nvrtc::supported_archs().map_err(|e| e.to_string())?;
    let mut archs = vec![80u32, 90];
    if supported.contains(&100) {
        archs.push(100);
    }
    if let Some(a) = archs.iter().find(|a| !supported.contains(a)) {
        return Err(format!("NVRTC {major}.{minor} cannot target sm_{a} (supports {supported:?})"));
    }
    let start = Instant::now();
    let mut jobs = Vec::new();
    for path in kernel_files(&root.join("kernels-cuda"), "cu")? {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !name.contains(filter) {
            continue;
        }
        let source =
            std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        for &sm in &archs {
            jobs.push((name.clone(), source.clone(), sm));
        }
    }
    // NVRTC is thread-safe: compile on every core (CI has two).
    let bar = crate::progress::Progress::new(jobs.len() as u64, "NVRTC");
    let outcomes = parallel_map(jobs, |(name, source, sm)| {
        // No disk cache: CI must see the compiler run.
        let r = nvrtc::compile_in(None, &name, &source, vt_cuda::kernels::HEADERS, Target::Cubin(sm));
        bar.inc();
        Outcome { file: name, arch: format!("sm_{sm}"), error: r.err().map(|e| e.to_string()) }
    });
    drop(bar);
    let inc: Vec<String> = includes.iter().map(|p| p.display().to_string()).collect();
    let secs = start.elapsed().as_secs_f64();
    Ok((format!("kernels-cuda: NVRTC {major}.{minor}, headers {}, {secs:.1} s", inc.join(", ")), outcomes))
}

/// `--warm-cache DIR --sm XY`: every `kernels-cuda/*.cu` (matching `filter`) compiled for
/// `sm_XY` into the cache under DIR, one line a file.
fn warm_cache(root: &Path, filter: &str, dir: &Path, sm: u32) -> Result<ExitCode, String> {
    use vt_cuda::nvrtc;
    if !nvrtc::available() {
        return Err("libnvrtc.so.13 not found: `source .ci/kernels-cuda-deps`".into());
    }
    // Before any thread starts: the cache folder vt-cuda reads, as on the device.
    // SAFETY (edition 2021: safe): no other thread exists yet.
    std::env::set_var("VT_CACHE_DIR", dir);
    let target = nvrtc::target_for(sm).map_err(|e| e.to_string())?;
    let includes = nvrtc::include_dirs().map_err(|e| e.to_string())?;
    println!("warming {} for {target:?}, headers {includes:?}", dir.display());
    let mut jobs = Vec::new();
    for path in kernel_files(&root.join("kernels-cuda"), "cu")? {
        let stem = path.file_stem().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if !stem.contains(filter) {
            continue;
        }
        let code = std::fs::read_to_string(&path).map_err(|e| format!("reading {}: {e}", path.display()))?;
        // KernelSource holds 'static texts (the embedded files); these live until exit.
        let src = vt_cuda::kernels::KernelSource { name: stem.leak(), code: code.leak() };
        jobs.push(src);
    }
    let results = parallel_map(jobs, |src| {
        let t = Instant::now();
        let r = vt_cuda::kernels::compile_module(&src, target);
        (src.name, r.map(|i| (i.bytes.len(), i.cached)), t.elapsed().as_secs_f64())
    });
    let mut ok = true;
    for (name, r, secs) in results {
        match r {
            Ok((bytes, cached)) => {
                println!(
                    "{name}.cu: {bytes} bytes, {} ({secs:.1} s)",
                    if cached { "already cached" } else { "compiled" }
                )
            }
            Err(e) => {
                ok = false;
                println!("{name}.cu: FAILED: {e}");
            }
        }
    }
    Ok(if ok { ExitCode::SUCCESS } else { ExitCode::FAILURE })
}

/// Prints the table and the failures' logs; true when everything compiled.
pub fn report(title: &str, outcomes: &[Outcome]) -> bool {
    let mut archs: Vec<&str> = Vec::new();
    let mut files: Vec<&str> = Vec::new();
    for o in outcomes {
        if !archs.contains(&o.arch.as_str()) {
            archs.push(&o.arch);
        }
        if !files.contains(&o.file.as_str()) {
            files.push(&o.file);
        }
    }
    let width = files.iter().map(|f| f.len()).max().unwrap_or(4).max(4);
    println!("\n{title}");
    print!("{:<width$}", "file");
    for a in &archs {
        print!("  {a:<8}");
    }
    println!();
    for f in &files {
        print!("{f:<width$}");
        for a in &archs {
            let cell = match outcomes.iter().find(|o| o.file == *f && o.arch == *a) {
                Some(Outcome { error: None, .. }) => "OK",
                Some(_) => "FAIL",
                None => "-",
            };
            print!("  {cell:<8}");
        }
        println!();
    }
    let failed: Vec<&Outcome> = outcomes.iter().filter(|o| o.error.is_some()).collect();
    for o in &failed {
        println!("\n--- {} for {} ---\n{}", o.file, o.arch, o.error.as_deref().unwrap_or(""));
    }
    println!("{} of {} compiles OK", outcomes.len() - failed.len(), outcomes.len());
    failed.is_empty()
}
