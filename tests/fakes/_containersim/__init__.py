"""Shared engine of the Apptainer/Singularity, enroot and Pyxis simulators in tests/fakes.

The programs in tests/fakes/apptainer, tests/fakes/enroot and tests/fakes/pyxis put this package
on sys.path and call one entry point each; tests/fakes/README.md lists what they reproduce and
the documentation and source each follows. Commands really run: in the image's root file system
through Charliecloud's ch-run (real on these machines), with the binds, working folder and
environment that the simulated runtime would give them.
"""
