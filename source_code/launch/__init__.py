"""Launching jobs for real: site profiles (the #SBATCH calculator), a sync check, crash simulation."""
