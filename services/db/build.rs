//! `sqlx::migrate!` embeds the migrations when this crate compiles, and
//! cargo does not know it reads them: a changed or added migration must
//! rebuild the crate, or a binary would run the schema it was built with.
fn main() {
    println!("cargo:rerun-if-changed=../../migrations");
}
