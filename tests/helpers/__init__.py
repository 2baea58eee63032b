"""What several test files share: estates, the real Slurm's record of jobs, servers' pools,
runners, apps and identities. Imported as `helpers.<module>` (tests/ is on sys.path)."""
