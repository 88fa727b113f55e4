pub mod decide;
