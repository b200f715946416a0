fn main() -> std::process::ExitCode {
    latchkey::cli::main()
}
