"""The command line: ``fairgang`` (cli.main), above every other package."""
