//! Build script. Without feature `cuda` it does nothing. With it:
//! 1. finds the CUDA toolchain (`DELTAKIT_CUDA_HOME`, then `.toolchain/cuda`, then `nvcc` on PATH);
//! 2. compiles every `csrc/**/*.cu` with nvcc for each arch in `DELTAKIT_CUDA_ARCHS` (default `90a`),
//!    caching objects by content so an unchanged file is never recompiled;
//! 3. AOT-compiles the Triton kernels of `triton_aot/manifest.toml` (`triton_aot/aot.py`) and
//!    compiles the generated launchers with the host C compiler;
//! 4. archives all objects into `libdeltakit_kernels.a`, links `cudart_static`;
//! 5. runs bindgen over `csrc/include/deltakit.h` + the generated `dk_triton.h`.

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=DELTAKIT_CUDA_HOME");
    println!("cargo:rerun-if-env-changed=DELTAKIT_CUDA_ARCHS");
    println!("cargo:rerun-if-env-changed=DELTAKIT_TRITON_PYTHON");
    #[cfg(feature = "cuda")]
    gpu::build();
}

#[cfg(feature = "cuda")]
mod gpu {
    use sha2::{Digest, Sha256};
    use std::env;
    use std::fmt::Write as _;
    use std::fs;
    use std::path::{Path, PathBuf};
    use std::process::Command;

    const SETUP_HINT: &str = "run `tools/setup-toolchain` (installs nvcc 13.0 and triton 3.6.0 \
                              into .toolchain/), or set DELTAKIT_CUDA_HOME to a CUDA 13.0 toolkit";

    struct Toolchain {
        /// Directory with `bin/nvcc`, `include/`, `lib/`.
        home: PathBuf,
        /// Python interpreter that can `import triton`.
        python: PathBuf,
    }

    fn fail(msg: &str) -> ! {
        // One clear message; cargo shows build-script stderr on failure.
        eprintln!("\ndeltakit build (feature `cuda`): {msg}\n");
        std::process::exit(1);
    }

    fn find_toolchain(root: &Path) -> Toolchain {
        let local = root.join(".toolchain");
        let home = if let Some(h) = env::var_os("DELTAKIT_CUDA_HOME") {
            PathBuf::from(h)
        } else if local.join("cuda/bin/nvcc").exists() {
            local.join("cuda")
        } else if let Some(nvcc) = which("nvcc") {
            nvcc.parent().and_then(Path::parent).map(Path::to_path_buf).unwrap_or_default()
        } else {
            fail(&format!("no CUDA toolchain found: {SETUP_HINT}"));
        };
        if !home.join("bin/nvcc").exists() {
            fail(&format!("{} has no bin/nvcc: {SETUP_HINT}", home.display()));
        }
        let python = if let Some(p) = env::var_os("DELTAKIT_TRITON_PYTHON") {
            PathBuf::from(p)
        } else if local.join("venv/bin/python").exists() {
            local.join("venv/bin/python")
        } else {
            PathBuf::from("python3")
        };
        Toolchain { home: home.canonicalize().unwrap_or(home), python }
    }

    fn which(exe: &str) -> Option<PathBuf> {
        env::split_paths(&env::var_os("PATH")?).map(|d| d.join(exe)).find(|p| p.is_file())
    }

    fn files_with_ext(dir: &Path, exts: &[&str], out: &mut Vec<PathBuf>) {
        let Ok(rd) = fs::read_dir(dir) else { return };
        let mut entries: Vec<_> = rd.filter_map(Result::ok).map(|e| e.path()).collect();
        entries.sort();
        for p in entries {
            if p.is_dir() {
                files_with_ext(&p, exts, out);
            } else if p.extension().and_then(|e| e.to_str()).is_some_and(|e| exts.contains(&e)) {
                out.push(p);
            }
        }
    }

    /// Arch list from `DELTAKIT_CUDA_ARCHS` (`"80;89;90a"`); SASS for each, PTX of the lowest.
    fn archs() -> Vec<String> {
        let raw = env::var("DELTAKIT_CUDA_ARCHS").unwrap_or_else(|_| "90a".to_string());
        let mut v: Vec<String> = raw
            .split([';', ','])
            .map(|s| s.trim().trim_start_matches("sm_").to_string())
            .filter(|s| !s.is_empty())
            .collect();
        for a in &v {
            let digits = a.trim_end_matches('a');
            if digits.is_empty() || !digits.chars().all(|c| c.is_ascii_digit()) {
                fail(&format!("DELTAKIT_CUDA_ARCHS: bad arch {a:?} (expected e.g. \"80;89;90a\")"));
            }
        }
        v.sort_by_key(|a| a.trim_end_matches('a').parse::<u32>().unwrap_or(0));
        v.dedup();
        v
    }

    fn gencode_flags(archs: &[String]) -> Vec<String> {
        let mut flags: Vec<String> =
            archs.iter().map(|a| format!("-gencode=arch=compute_{a},code=sm_{a}")).collect();
        if let Some(lowest) = archs.first() {
            // PTX of the lowest arch, so a newer GPU can still JIT; never needed on listed archs.
            flags.push(format!("-gencode=arch=compute_{lowest},code=compute_{lowest}"));
        }
        flags
    }

    fn hash_files(h: &mut Sha256, files: &[PathBuf]) {
        for f in files {
            h.update(f.to_string_lossy().as_bytes());
            h.update(fs::read(f).unwrap_or_else(|e| fail(&format!("read {}: {e}", f.display()))));
        }
    }

    /// Compiles each .cu once per content hash (file + all csrc headers + flags) into `cache`.
    fn compile_cuda(root: &Path, tc: &Toolchain, out: &Path, archs: &[String]) -> Vec<PathBuf> {
        let csrc = root.join("csrc");
        let mut cu = Vec::new();
        files_with_ext(&csrc, &["cu"], &mut cu);
        let mut headers = Vec::new();
        files_with_ext(&csrc, &["h", "cuh", "hpp"], &mut headers);
        for f in cu.iter().chain(&headers) {
            println!("cargo:rerun-if-changed={}", f.display());
        }
        println!("cargo:rerun-if-changed={}", csrc.display());
        let flags = gencode_flags(archs);
        let mut common = Sha256::new();
        hash_files(&mut common, &headers);
        common.update(flags.join(" ").as_bytes());
        common.update(tc.home.to_string_lossy().as_bytes());
        let cache = out.join("cu-cache");
        fs::create_dir_all(&cache).unwrap();
        let nvcc = tc.home.join("bin/nvcc");
        let mut objects = Vec::new();
        for src in &cu {
            let mut h = common.clone();
            hash_files(&mut h, std::slice::from_ref(src));
            let digest = h.finalize();
            let mut key = String::new();
            for b in &digest[..12] {
                let _ = write!(key, "{b:02x}");
            }
            let stem = src.strip_prefix(&csrc).unwrap().to_string_lossy().replace('/', "_");
            let obj = cache.join(format!("{stem}.{key}.o"));
            if !obj.exists() {
                let tmp = obj.with_extension("tmp.o");
                let status = Command::new(&nvcc)
                    .args(["-c", "-O3", "-std=c++17", "-Xcompiler", "-fPIC", "-lineinfo"])
                    .args(["--expt-relaxed-constexpr", "-Xptxas", "-warn-spills"])
                    .args(&flags)
                    .arg(format!("-I{}", csrc.join("include").display()))
                    .arg("-o")
                    .arg(&tmp)
                    .arg(src)
                    .status()
                    .unwrap_or_else(|e| fail(&format!("cannot run {}: {e}", nvcc.display())));
                if !status.success() {
                    fail(&format!("nvcc failed on {}", src.display()));
                }
                fs::rename(&tmp, &obj).unwrap();
                println!("cargo:warning=nvcc compiled {} for sm_{}", stem, archs.join(",sm_"));
            }
            objects.push(obj);
        }
        objects
    }

    /// Runs `triton_aot/aot.py` and compiles its generated launchers with the host C compiler.
    fn compile_triton(root: &Path, tc: &Toolchain, out: &Path, archs: &[String]) -> Vec<PathBuf> {
        let aot_dir = root.join("triton_aot");
        let mut inputs = Vec::new();
        files_with_ext(&aot_dir, &["py", "toml", "c", "h"], &mut inputs);
        for f in &inputs {
            println!("cargo:rerun-if-changed={}", f.display());
        }
        println!("cargo:rerun-if-changed={}", aot_dir.display());
        let gen = out.join("triton");
        fs::create_dir_all(&gen).unwrap();
        let status = Command::new(&tc.python)
            .arg(aot_dir.join("aot.py"))
            .arg("--out")
            .arg(&gen)
            .arg("--archs")
            .arg(archs.join(";"))
            .env("PATH", prepend_path(&tc.home.join("bin")))
            .status()
            .unwrap_or_else(|e| {
                fail(&format!(
                    "cannot run Triton AOT with {}: {e}; {SETUP_HINT}",
                    tc.python.display()
                ))
            });
        if !status.success() {
            fail(&format!(
                "Triton AOT failed (python: {}; needs triton==3.6.0): {SETUP_HINT}",
                tc.python.display()
            ));
        }
        let list = fs::read_to_string(gen.join("triton_manifest.txt")).unwrap_or_default();
        let mut build = cc::Build::new();
        build
            .include(root.join("csrc/include"))
            .include(aot_dir.join("runtime"))
            .include(&gen)
            .include(tc.home.join("include"))
            .flag_if_supported("-std=c11")
            .warnings(true)
            .out_dir(gen.join("obj"));
        build.file(aot_dir.join("runtime/dk_triton_runtime.c"));
        for line in list.lines().filter(|l| !l.trim().is_empty()) {
            build.file(line.trim());
        }
        build.compile_intermediates()
    }

    fn prepend_path(dir: &Path) -> std::ffi::OsString {
        let mut paths = vec![dir.to_path_buf()];
        if let Some(p) = env::var_os("PATH") {
            paths.extend(env::split_paths(&p));
        }
        env::join_paths(paths).unwrap()
    }

    fn bindgen(root: &Path, tc: &Toolchain, out: &Path) {
        let wrapper = out.join("bindings_wrapper.h");
        fs::write(&wrapper, "#include \"deltakit.h\"\n#include \"dk_triton.h\"\n").unwrap();
        let bindings = bindgen::Builder::default()
            .header(wrapper.to_string_lossy())
            .clang_arg(format!("-I{}", root.join("csrc/include").display()))
            .clang_arg(format!("-I{}", out.join("triton").display()))
            .clang_arg(format!("-I{}", tc.home.join("include").display()))
            .allowlist_function("dk_.*")
            .allowlist_type("Dk.*")
            .allowlist_type("dk_.*")
            .newtype_enum("dk_status")
            .derive_default(true)
            .layout_tests(false)
            .generate_comments(true)
            .generate()
            .unwrap_or_else(|e| fail(&format!("bindgen failed (needs libclang-dev): {e}")));
        bindings.write_to_file(out.join("bindings.rs")).unwrap();
    }

    pub fn build() {
        let root = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
        let out = PathBuf::from(env::var("OUT_DIR").unwrap());
        let tc = find_toolchain(&root);
        let archs = archs();
        let mut objects = compile_cuda(&root, &tc, &out, &archs);
        objects.extend(compile_triton(&root, &tc, &out, &archs));
        // Archive with `ar` via cc (objects only; nothing is recompiled here).
        let lib_dir = out.join("lib");
        fs::create_dir_all(&lib_dir).unwrap();
        let mut ar = cc::Build::new();
        ar.out_dir(&lib_dir).cargo_metadata(false);
        for o in &objects {
            ar.object(o);
        }
        ar.compile("deltakit_kernels");
        println!("cargo:rustc-link-search=native={}", lib_dir.display());
        println!("cargo:rustc-link-lib=static=deltakit_kernels");
        println!("cargo:rustc-link-search=native={}", tc.home.join("lib").display());
        println!("cargo:rustc-link-lib=static=cudart_static");
        for lib in ["stdc++", "dl", "rt", "pthread"] {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
        println!("cargo:archs={}", archs.join(";"));
        bindgen(&root, &tc, &out);
    }
}
