"""The notebooks' side: profiles, results files and verdicts, the plot style, running and publishing notebooks."""
