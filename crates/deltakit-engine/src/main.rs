//! `deltakit` command-line tool. For now: `info` (build and device report). Model commands
//! (`generate`, `bench`) arrive with the engine (issue 6).

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "deltakit", version, about = "Gated DeltaNet / Qwen3.5 kernels and engine")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print what this build contains and which devices it can use.
    Info,
}

fn main() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Info => info(),
    }
}

fn info() -> Result<()> {
    println!("deltakit {}", env!("CARGO_PKG_VERSION"));
    println!("cpu reference backend: yes (deltakit-ref)");
    #[cfg(feature = "cuda")]
    {
        println!("cuda backend: built (kernels: smoke.axpy [CUDA], smoke.vadd [Triton AOT])");
        match deltakit::try_context(0) {
            Some(ctx) => {
                let n = deltakit::cudarc::driver::CudaContext::device_count()?;
                let (maj, min) = ctx.compute_capability()?;
                println!("cuda devices: {n} (device 0: {}, sm_{maj}{min})", ctx.name()?);
            }
            None => println!("cuda devices: none usable on this machine"),
        }
    }
    #[cfg(not(feature = "cuda"))]
    println!("cuda backend: not built (rebuild with `--features cuda`)");
    // Prove the CPU path end to end on a tiny op.
    let (a, b) = ([1.0f32, 2.0, 3.0], [0.5f32, 0.25, 0.125]);
    let mut out = [0.0f32; 3];
    deltakit_ref::smoke::vadd_f32(&a, &b, &mut out);
    println!("cpu smoke.vadd([1,2,3],[0.5,0.25,0.125]) = {out:?}");
    Ok(())
}
