//! Safe wrappers, one module per op family (`<family>.<op>` ids, see KERNELS.md).

pub mod smoke;
