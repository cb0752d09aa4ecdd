pub mod chunk;
pub mod remote;
pub mod similarity;
pub mod store;
