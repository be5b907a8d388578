fn main() {
    eprintln!("nodelb-agent: not yet implemented (see issue 3)");
    std::process::exit(2);
}
