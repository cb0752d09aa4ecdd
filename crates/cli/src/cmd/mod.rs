pub mod chunk;
pub mod similarity;
pub mod store;
