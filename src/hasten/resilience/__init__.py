"""Runs that survive trouble: preemption, requeue, automatic resume, and the hang doctor with its report."""
