use super::*;
use std::collections::HashSet;
use std::ffi::c_void;

extern "C" fn never_called() {}

/// A resolver that knows every symbol except `without`.
fn fake(without: &[&str]) -> impl Fn(&CStr) -> Option<*mut c_void> {
    let without: HashSet<String> = without.iter().map(|s| s.to_string()).collect();
    move |name: &CStr| {
        let name = name.to_str().unwrap();
        (!without.contains(name)).then_some(never_called as *mut c_void)
    }
}

#[test]
fn a_complete_driver_has_both_tables() {
    let d = Driver::from_resolver(None, &fake(&[])).unwrap();
    assert!(d.vmm().is_ok());
}

#[test]
fn a_missing_optional_symbol_disables_only_vmm_and_names_what_is_missing() {
    let d = Driver::from_resolver(None, &fake(&["cuMemCreate", "cuIpcOpenMemHandle_v2"]))
        .expect("the required table is complete, so the driver loads");
    let Err(e) = d.vmm() else {
        panic!("vmm available without cuMemCreate")
    };
    assert!(matches!(e, crate::Error::Unsupported(_)), "{e}");
    let text = e.to_string();
    assert!(text.contains("cuMemCreate"), "{text}");
    assert!(text.contains("cuIpcOpenMemHandle_v2"), "{text}");
    assert!(!text.contains("cuMemRelease"), "{text}");
}

#[test]
fn a_missing_required_symbol_fails_the_load_naming_every_one() {
    let Err(e) = Driver::from_resolver(None, &fake(&["cuEventQuery", "cuMemAlloc_v2"])) else {
        panic!("loaded without required symbols")
    };
    assert!(
        e.contains("cuEventQuery") && e.contains("cuMemAlloc_v2"),
        "{e}"
    );
    assert!(!e.contains("cuMemCreate"), "{e}");
}

#[test]
fn the_optional_table_lists_the_vmm_and_ipc_calls() {
    // Every optional symbol missing: all of them are named.
    let names = [
        "cuMemCreate",
        "cuMemRelease",
        "cuMemExportToShareableHandle",
        "cuMemImportFromShareableHandle",
        "cuMemAddressReserve",
        "cuMemAddressFree",
        "cuMemMap",
        "cuMemUnmap",
        "cuMemSetAccess",
        "cuMemGetAllocationGranularity",
        "cuIpcGetMemHandle",
        "cuIpcOpenMemHandle_v2",
        "cuIpcCloseMemHandle",
        "cuDeviceGetAttribute",
    ];
    let Err(missing) = Vmm::resolve(&fake(&names)) else {
        panic!("resolved with nothing")
    };
    assert_eq!(missing, names.to_vec());
    // cuPointerGetAttribute is required (array interfaces need it), so it is always there.
    assert!(Vmm::resolve(&fake(&["cuPointerGetAttribute"])).is_ok());
}

#[test]
fn a_driver_without_the_3d_copy_loses_only_strided_copies() {
    let d = Driver::from_resolver(None, &fake(&["cuMemcpy3DAsync_v2"]))
        .expect("the required table is complete, so the driver loads");
    assert!(d.vmm().is_ok() && d.launch().is_ok());
    let Err(e) = d.strided() else {
        panic!("strided copies available without cuMemcpy3DAsync_v2")
    };
    assert!(matches!(e, crate::Error::Unsupported(_)), "{e}");
    assert!(e.to_string().contains("cuMemcpy3DAsync_v2"), "{e}");
    assert!(Driver::from_resolver(None, &fake(&[]))
        .unwrap()
        .strided()
        .is_ok());
}
