"""`querygate`'s command line: argparse, and one function per command."""
