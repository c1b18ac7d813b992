"""The outputs room: what is made from a Run for people and machines (the HTML report, its
sections and plots, diff, the CI gate, the Perfetto export); it may import the run room and
everything below it, never capture or the CLI."""
