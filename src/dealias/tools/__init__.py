"""Tools around the compiler: the demo, the fuzzer and the command line."""
