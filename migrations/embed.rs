// The build scripts' one piece of embedding, included by `store/build.rs`
// and `hub/build.rs`: each migration directory becomes a Rust file in
// OUT_DIR holding `&[(version, description, sql)]`, the SQL included from
// the file itself. The version and description are read from the file's
// name as sqlx reads them (`0001_first_table.sql` is version 1, "first
// table"), so the migrations tables of existing databases match.

/// Writes `$OUT_DIR/{name}.rs` for the `.sql` files of `dir`, in order.
fn embed_migrations(dir: &str, name: &str) {
    println!("cargo:rerun-if-changed={dir}");
    let mut files: Vec<std::path::PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|error| panic!("read {dir}: {error}"))
        .map(|entry| entry.unwrap_or_else(|error| panic!("read {dir}: {error}")).path())
        .filter(|path| path.extension().is_some_and(|extension| extension == "sql"))
        .collect();
    files.sort();
    let mut out = String::from("&[\n");
    for path in files {
        let path = std::fs::canonicalize(&path)
            .unwrap_or_else(|error| panic!("{}: {error}", path.display()));
        let file = path
            .file_name()
            .and_then(|file| file.to_str())
            .unwrap_or_else(|| panic!("{}: not a UTF-8 name", path.display()));
        let (version, rest) = file
            .split_once('_')
            .unwrap_or_else(|| panic!("{file}: not VERSION_DESCRIPTION.sql"));
        let version: i64 = version
            .parse()
            .unwrap_or_else(|_| panic!("{file}: the version is not a number"));
        let description = rest.trim_end_matches(".sql").replace('_', " ");
        let source = path
            .to_str()
            .unwrap_or_else(|| panic!("{}: not a UTF-8 path", path.display()));
        out.push_str(&format!(
            "    ({version}, {description:?}, include_str!({source:?})),\n"
        ));
    }
    out.push_str("]\n");
    let out_dir = std::env::var("OUT_DIR").expect("cargo sets OUT_DIR");
    std::fs::write(std::path::Path::new(&out_dir).join(format!("{name}.rs")), out)
        .unwrap_or_else(|error| panic!("write the embedded {name}: {error}"));
}
