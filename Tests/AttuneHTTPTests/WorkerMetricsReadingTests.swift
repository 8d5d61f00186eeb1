@testable import AttuneHTTP
import XCTest

/// The dashboard reads a worker's own /metrics: these lines are what swift-prometheus writes for a worker.
final class WorkerMetricsReadingTests: XCTestCase {
    func testAWorkersSlotsDeliveriesAndSettledJobsAreRead() throws {
        let text = """
            # TYPE attune_worker_info gauge
            attune_worker_info{worker="w-\\"quoted\\"-1"} 1.0
            attune_build_info{version="0.40.0-dev+abc1234"} 1
            attune_training_kernels_info{kernel_set="avx2",blis="haswell"} 1
            attune_slot_state{slot="0",state="idle"} 0
            attune_slot_state{slot="0",state="training"} 1
            attune_slot_state{slot="0",state="committing"} 0
            attune_slot_state{slot="1",state="idle"} 1
            attune_slot_state{slot="1",state="training"} 0
            attune_slot_state{slot="1",state="committing"} 0
            attune_deliveries_in_hand 7
            attune_jobs_total{outcome="committed"} 120
            attune_jobs_total{outcome="rejected"} 3
            attune_jobs_total{outcome="handed_back"} 40
            attune_jobs_total_created 1.7e9
            """
        let reading = try XCTUnwrap(WorkerMetricsReading(text: text))
        XCTAssertEqual(reading.worker, "w-\"quoted\"-1")
        XCTAssertEqual(reading.release, "0.40.0-dev+abc1234")
        XCTAssertEqual(reading.kernels, "blis=haswell kernel_set=avx2")
        XCTAssertEqual(reading.slots, 2)
        XCTAssertEqual(reading.busySlots, 1)
        XCTAssertEqual(reading.deliveriesInHand, 7)
        XCTAssertEqual(reading.jobsSettled, 123, "a hand-back settles nothing")
    }

    func testAnotherServicesMetricsAreNoWorkers() {
        XCTAssertNil(WorkerMetricsReading(text: "process_cpu_seconds_total 12\nhttp_requests_total{code=\"200\"} 5\n"))
        XCTAssertNil(WorkerMetricsReading(text: "<html>not metrics</html>"))
    }
}
