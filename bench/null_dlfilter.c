/* The floor for decode benchmarks: a perf dlfilter that drops every sample, nothing else. */
#include <perf/perf_dlfilter.h>

int filter_event_early(void *data, const struct perf_dlfilter_sample *sample, void *ctx)
{
	(void)data;
	(void)sample;
	(void)ctx;
	return 1;
}
