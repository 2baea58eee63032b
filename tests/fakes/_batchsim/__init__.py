"""Shared engine of the PBS Professional, Torque and LSF simulators in tests/fakes.

The programs in tests/fakes/pbspro, tests/fakes/torque and tests/fakes/lsf put this
package on sys.path and call one entry point each; tests/fakes/README.md describes
the commands, formats, exit codes and environment variables they reproduce.
"""
