//! Safe wrappers, one module per op family (`<family>.<op>` ids, see KERNELS.md).

pub mod attn;
pub mod conv1d;
pub mod gdr;
pub mod gemm;
pub mod init;
pub mod mlp;
pub mod norm;
pub mod sample;
pub mod smoke;
mod validate;
